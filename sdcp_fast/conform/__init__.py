"""The black-box conformance kit (``sdcp-fast conform URL``, docs/conformance.md)."""
