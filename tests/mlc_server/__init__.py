"""The MLC server (sdcp-fast mlc): its requests, limits, authorization and metrics."""
