"""``sdcp-fast mlc``: serve the multi-level cache and its commit logs over HTTP(S)."""

from __future__ import annotations

import argparse

HELP = "serve the multi-level cache (objects, leases, commit logs) over HTTP with mTLS"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--root", help="folder for the disk tier and commit logs (default: $SDCP_MLC_ROOT "
                                       "or ~/.cache/sdcp_fast/mlc)")
    parser.add_argument("--host-mib", type=int, default=1024, help="page-locked host tier capacity")
    parser.add_argument("--disk-mib", type=int, default=16384, help="disk tier capacity")
    parser.add_argument("--device-mib", type=int, default=0, help="CUDA device tier capacity (0: none)")
    parser.add_argument("--redis", metavar="URL", help="networked tier, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--redis-mib", type=int, default=4096)
    parser.add_argument("--max-objects", type=int, default=None, help="objects the index holds at most "
                        "(default 262144; least recently used unleased ones are evicted beyond)")
    parser.add_argument("--max-open-logs", type=int, default=64, help="commit logs open at once (descriptors)")
    parser.add_argument("--cert", help="server certificate (PEM); enables TLS")
    parser.add_argument("--key", help="server private key (PEM)")
    parser.add_argument("--ca", help="CA whose client certificates are required (mTLS)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import os
    import sys

    from aiohttp import web

    from sdcp_fast.commitlog import default_root
    from sdcp_fast.embedded import embedded
    from sdcp_fast.servers.mlc import init_app, server_ssl

    if bool(args.cert) != bool(args.key):
        print("sdcp-fast mlc: --cert and --key go together", file=sys.stderr)
        return 2
    if args.ca and not args.cert:
        print("sdcp-fast mlc: --ca (client certificates) needs --cert/--key", file=sys.stderr)
        return 2
    root = args.root or default_root()
    os.makedirs(root, exist_ok=True)
    mib = 1 << 20
    limits = {} if args.max_objects is None else {"max_objects": args.max_objects}
    store = embedded(root, host_bytes=args.host_mib * mib, disk_bytes=args.disk_mib * mib,
                     device_bytes=args.device_mib * mib, redis_url=args.redis, redis_bytes=args.redis_mib * mib,
                     max_open_logs=args.max_open_logs, **limits)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass  # the default loop serves the same API, a little slower
    ctx = server_ssl(args.cert, args.key, args.ca) if args.cert else None
    scheme = "https" if ctx else "http"
    web.run_app(init_app(store.mlc, store.logs, on_close=store.close), host=args.host, port=args.port, ssl_context=ctx,
                print=lambda _: print(f"sdcp-fast mlc: serving {scheme}://{args.host}:{args.port} "
                                      f"(root {root}{', client certificates required' if args.ca else ''})",
                                      flush=True))
    return 0
