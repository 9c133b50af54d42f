"""The black-box conformance kit (issue 14, section 3)."""
