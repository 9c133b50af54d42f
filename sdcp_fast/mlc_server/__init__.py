"""The MLC server, ``sdcp-fast mlc``: the cache index and the commit logs of :mod:`sdcp_fast.store`'s
in-process implementation served over HTTP/2 + mTLS (and HTTP/1.1). ``server`` holds the
application; ``server_requests`` the request parsing and limits, ``server_metrics`` its metrics,
``server_http1`` the HTTP/1.1 framing, ``records`` the bounded decoding of commit records.
See docs/mlc.md.
"""
