"""The black-box conformance kit's own tests."""
