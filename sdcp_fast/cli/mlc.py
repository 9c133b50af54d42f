"""``sdcp-fast mlc``: serve the multi-level cache and its commit logs over HTTP/2 with mutual
TLS (the roles' transport), or over HTTP/1.1 with ``--http1`` for debugging.

Secure by default, as the role services: certificates come from a ``sdcp-fast certs`` folder
and ``--name`` (or ``--cert/--key/--ca``); without them the command refuses to start unless
``--insecure``, which serves plain HTTP on loopback only and says so loudly.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

HELP = "serve the multi-level cache (objects, leases, commit logs) over HTTP/2 with mutual TLS"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--root", help="folder for the disk tier and commit logs (default: $SDCP_MLC_ROOT "
                                       "or ~/.cache/sdcp_fast/mlc)")
    parser.add_argument("--host-mib", type=int, default=1024, help="page-locked host tier capacity")
    parser.add_argument("--shm", default="/dev/shm", metavar="DIR",
                        help="memory file system where same-host clients write and map objects "
                             "(default /dev/shm; 'none': every object crosses the network)")
    parser.add_argument("--disk-mib", type=int, default=16384, help="disk tier capacity")
    parser.add_argument("--device-mib", type=int, default=0, help="CUDA device tier capacity (0: none)")
    parser.add_argument("--redis", metavar="URL", help="networked tier, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--redis-mib", type=int, default=4096)
    parser.add_argument("--mooncake-master", metavar="HOST:PORT",
                        help="networked tier on Mooncake Store instead of Redis: its mooncake_master's RPC address")
    parser.add_argument("--mooncake-metadata", metavar="URL",
                        help="the transfer engine's metadata service (default: the master's own, "
                             "http://<master host>:8080/metadata; or etcd://..., P2PHANDSHAKE)")
    parser.add_argument("--mooncake-mib", type=int, default=4096, help="bytes this MLC keeps in Mooncake Store")
    parser.add_argument("--mooncake-segment-mib", type=int, default=512,
                        help="memory this node lends Mooncake Store (0: none)")
    parser.add_argument("--mooncake-replicas", type=int, default=2,
                        help="copies of each object, each in another node's segment where there are several")
    parser.add_argument("--mooncake-hostname", metavar="ADDR",
                        help="address other nodes reach this one at (default: the one on the route to the master)")
    parser.add_argument("--mooncake-attach-later", action="store_true",
                        help="start without Mooncake Store when its master does not answer (the other tiers "
                             "serve), and attach once it does; without it such a start fails")
    parser.add_argument("--max-objects", type=int, default=None, help="objects the index holds at most "
                        "(default 262144; least recently used unleased ones are evicted beyond)")
    parser.add_argument("--max-open-logs", type=int, default=64, help="commit logs open at once (descriptors)")
    parser.add_argument("--certs", metavar="DIR", help="a `sdcp-fast certs` folder; the certificate used is --name's")
    parser.add_argument("--name", default="mlc", help="instance name in --certs (default mlc)")
    parser.add_argument("--cert", help="server certificate (PEM) instead of --certs")
    parser.add_argument("--key", help="server private key (PEM) instead of --certs")
    parser.add_argument("--ca", help="CA (PEM) whose client certificates are required, instead of --certs")
    parser.add_argument("--insecure", action="store_true",
                        help="plain HTTP on loopback, nobody authenticated, no authorization (development only)")
    parser.add_argument("--http1", action="store_true",
                        help="serve HTTP/1.1 (aiohttp) instead of HTTP/2, for debugging with HTTP/1.1 tools")


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from sdcp_fast.deploy.service import Security

    try:
        security = Security.from_args(args, "mlc")
        from sdcp_fast.transport.binding import is_loopback

        if security.insecure and not is_loopback(args.host):
            raise ValueError(f"--insecure serves loopback addresses only, not {args.host!r}")
        if args.redis and args.mooncake_master:
            raise ValueError("one networked tier: --redis or --mooncake-master, not both")
    except (ValueError, FileNotFoundError) as exc:
        print(f"sdcp-fast mlc: {exc}", file=sys.stderr)
        return 2

    from sdcp_fast.commitlog import default_root
    from sdcp_fast.store import embedded

    root = args.root or default_root()
    os.makedirs(root, exist_ok=True)
    print(f"sdcp-fast mlc: opening the store at {root}", file=sys.stderr, flush=True)  # a slow disk shows here
    mib = 1 << 20
    limits = {} if args.max_objects is None else {"max_objects": args.max_objects}
    try:
        store = embedded(root, host_bytes=args.host_mib * mib, disk_bytes=args.disk_mib * mib,
                         device_bytes=args.device_mib * mib, redis_url=args.redis, redis_bytes=args.redis_mib * mib,
                         mooncake=_mooncake(args), mooncake_bytes=args.mooncake_mib * mib,
                         max_open_logs=args.max_open_logs, shm=_shm(args.shm), **limits)
    except ConnectionError as exc:  # the networked tier's server or master does not answer
        print(f"sdcp-fast mlc: {exc}", file=sys.stderr)
        return 2
    scheme = "http" if security.insecure else "https"
    protocol = "HTTP/1.1" if args.http1 else "HTTP/2"
    how = "INSECURE: no authentication" if security.insecure else "TLS 1.3, client certificates required"

    def ready(port: int) -> None:
        print(f"sdcp-fast mlc: serving {scheme}://{args.host}:{port} ({protocol}, {how}; root {root})", flush=True)

    if args.http1:
        return _run_http1(args, security, store, ready)
    from sdcp_fast.transport.loop import run as run_loop

    run_loop(_serve_h2(args, security, store, ready), settle=True)
    return 0


def _shm(folder: str) -> str | None:
    import os

    return folder if folder != "none" and os.access(folder, os.W_OK) else None


def _mooncake(args: argparse.Namespace) -> Any:
    if not args.mooncake_master:
        return None
    from sdcp_fast.cache.tiers.mooncake import MooncakeConfig

    host = args.mooncake_master.rpartition(":")[0] or "127.0.0.1"
    return MooncakeConfig(args.mooncake_master, args.mooncake_metadata or f"http://{host}:8080/metadata",
                          segment_bytes=args.mooncake_segment_mib << 20, replicas=args.mooncake_replicas,
                          hostname=args.mooncake_hostname, attach_later=args.mooncake_attach_later)


async def _serve_h2(args: argparse.Namespace, security: Any, store: Any, ready: Callable[[int], None]) -> None:
    from sdcp_fast.deploy.service import serve_until_signal
    from sdcp_fast.mlc_server.server import MLCService, serve

    service = MLCService(store.mlc, store.logs)
    server = await serve(service, args.host, args.port, ssl=security.server_context(),
                         insecure=security.insecure)
    try:
        await serve_until_signal(server, lambda: ready(server.port))
    finally:
        store.close()


def _run_http1(args: argparse.Namespace, security: Any, store: Any, ready: Callable[[int], None]) -> int:
    from aiohttp import web

    from sdcp_fast.mlc_server.server_http1 import init_app
    from sdcp_fast.transport.loop import new_loop
    from sdcp_fast.transport.tls import server_context

    if security.insecure:
        from sdcp_fast.transport.binding import check_insecure

        check_insecure(args.host, "MLC HTTP/1.1 server binding")  # warns loudly
    ctx = None if security.insecure else server_context(
        security.cert, security.key, security.ca, alpn=("http/1.1",))
    web.run_app(init_app(store.mlc, store.logs, on_close=store.close), host=args.host, port=args.port,
                ssl_context=ctx, print=lambda _: ready(args.port), loop=new_loop())
    return 0
