"""Run a role as a service: its handler on the HTTP/2 + mutual TLS transport (§5.1), its
clients on the same transport, the MLC through an ``sdcp-fast mlc`` server, until a signal.

Security comes from a ``sdcp-fast certs`` folder and an instance name (or explicit
``--cert/--key/--ca``): the certificate's URI SANs are the instance's base URI and role.
``--insecure`` serves plain HTTP/2 on loopback only, where nobody is authenticated: every
request carries no identity (``peer`` None), whatever its headers claim, so every resource
that needs a role answers 403 (docs/security.md, "--insecure"). Only what needs no identity
(metrics, health) is served: a running deployment needs certificates (``sdcp-fast certs``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.store.interface import Store
from sdcp_fast.store.remote_store import RemoteStore
from sdcp_fast.transport.base import Handler, Transport

log = logging.getLogger("sdcp_fast.deploy")

L = TypeVar("L")  # what a role command loads before it serves (run_role)


@dataclass(frozen=True)
class Security:
    """Where a service's TLS material is, or ``insecure``."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    insecure: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace, name: str) -> Security:
        if args.insecure:
            return cls(insecure=True)
        if args.cert or args.key or args.ca:
            if not (args.cert and args.key and args.ca):
                raise ValueError("--cert, --key and --ca go together")
            return cls(args.cert, args.key, args.ca)
        if not args.certs:
            raise ValueError("give --certs DIR (from `sdcp-fast certs DIR`), or --cert/--key/--ca, or --insecure")
        from sdcp_fast.transport.certs import instance_files

        cert, key, ca = instance_files(args.certs, args.name or name)
        return cls(cert, key, ca)

    def server_context(self) -> ssl.SSLContext | None:
        if self.insecure:
            return None
        from sdcp_fast.transport.tls import server_context

        assert self.cert and self.key and self.ca
        return server_context(self.cert, self.key, self.ca)

    def client_context(self, alpn: tuple[str, ...] = ("h2",)) -> ssl.SSLContext | None:
        if self.insecure:
            return None
        from sdcp_fast.transport.tls import client_context

        assert self.cert and self.key and self.ca
        return client_context(self.cert, self.key, self.ca, alpn=alpn)


def add_service_arguments(p: argparse.ArgumentParser, *, name: str, port: int, router: bool = True) -> None:
    """The options every role service shares."""
    p.add_argument("--uri", default=f"https://127.0.0.1:{port}/",
                   help=f"this instance's base URI, as its certificate names it (default https://127.0.0.1:{port}/)")
    p.add_argument("--listen", metavar="HOST:PORT", help="address to bind (default: the base URI's host and port)")
    if router:
        p.add_argument("--router", default="https://127.0.0.1:8500/",
                       help="the router's base URI; several routers that share their routing records: "
                            "comma-separated (each gets this instance's status and events)")
    p.add_argument("--mlc", default="https://127.0.0.1:8470", help="the MLC server (sdcp-fast mlc) base URL")
    p.add_argument("--certs", metavar="DIR", help="a `sdcp-fast certs` folder; the certificate used is --name's")
    p.add_argument("--name", default=name, help=f"instance name in --certs (default {name})")
    p.add_argument("--cert", help="certificate (PEM) instead of --certs")
    p.add_argument("--key", help="private key (PEM) instead of --certs")
    p.add_argument("--ca", help="CA (PEM) that signs every peer, instead of --certs")
    p.add_argument("--insecure", action="store_true",
                   help="plain HTTP/2 on loopback, nobody authenticated (development only)")
    p.add_argument("--status-ttl-ms", type=int, default=10_000,
                   help="ttl_ms of this instance's status reports; it reports three times as often (default 10000)")
    p.add_argument("--log-level", default="info", help="debug, info, warning (default info)")


def listen_address(args: argparse.Namespace) -> tuple[str, int]:
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        return host or "127.0.0.1", int(port)
    parts = urlsplit(args.uri)
    return parts.hostname or "127.0.0.1", parts.port or 443


def client_transport(security: Security, peer: Peer) -> Transport:
    from sdcp_fast.transport.nativeclient import h2_client

    if security.insecure:
        return h2_client(insecure=True)  # proves nothing: ``peer`` is not claimed either
    return h2_client(security.client_context())


def remote_store(base_url: str, security: Security) -> RemoteStore:
    """The store of the ``sdcp-fast mlc`` server at ``base_url``, reached over HTTP/2 with
    this service's own certificate."""
    return RemoteStore(base_url, ssl=security.client_context())


NodeReader = Callable[[argparse.Namespace], Callable[[], Iterable[str]] | None]


def role_store(base_url: str, security: Security, nodes: Callable[[], Iterable[str]] | None) -> Store:
    """The ``sdcp-fast mlc`` server at ``base_url``; where ``nodes`` lists a cluster's MLC
    nodes (base URIs), that server as this host's node among them
    (:class:`~sdcp_fast.store.nodes.NodeStore`: every node reached with this service's
    certificate, only those ``nodes`` lists)."""
    if nodes is None:
        return remote_store(base_url, security)
    from sdcp_fast.store.nodes import NodeStore

    return NodeStore(base_url, lambda base: remote_store(base, security), nodes)


def run_role(args: argparse.Namespace, role: PeerRole, load: Callable[[], L],
             build: Callable[[L, Store, Transport], Any], ready: Callable[[L], str],
             mlc_nodes: NodeReader | None = None) -> int:
    """What every role command does: log at ``--log-level``; take its security from the
    options; ``load()`` what it serves (a model, a drafter; a missing file or a bad name ends
    the command with status 2 and one line); set ``--threads``; then, on the service loop,
    ``build`` the role on the MLC server's store and a client transport proving ``role`` at
    ``--uri``, and serve it until SIGINT or SIGTERM. ``ready(loaded)`` describes it.
    ``mlc_nodes(args)``, where it gives a reader of a cluster's MLC nodes, makes the store
    the cluster's (:func:`role_store`)."""
    configure_logging(args.log_level)
    # Each step of a start is logged, so a slow start (sdcp-fast up waiting) shows where it is.
    what = f"sdcp-fast {role.value}"
    try:
        security = Security.from_args(args, args.name)
        nodes = mlc_nodes(args) if mlc_nodes is not None else None
        log.info("%s: loading (model %s%s)", what, getattr(args, "model", "-"),
                 f", on {args.device}" if getattr(args, "device", None) else "")
        began = time.monotonic()
        loaded = load()
        log.info("%s: loaded in %.1f s: %s", what, time.monotonic() - began, ready(loaded))
    except (FileNotFoundError, ValueError) as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    host, port = listen_address(args)

    async def main() -> int:
        log.info("%s: building the role (MLC at %s)", what, args.mlc)
        served = build(loaded, role_store(args.mlc, security, nodes), client_transport(security, Peer(args.uri, role)))
        await serve_role(served, host=host, port=port, security=security,
                         ready=f"sdcp-fast {role.value} ({ready(loaded)})")
        return 0

    from sdcp_fast.transport.loop import run

    return run(main(), settle=True)


def configure_logging(level: str) -> None:
    """A service's log: stderr, the same warning at most once per 10 s (then with a count of
    those not shown). Logging someone else set up (a host program, pytest) is left alone, its
    handlers unfiltered, as ``logging.basicConfig`` leaves it."""
    from sdcp_fast.deploy.log_repeats import RepeatLimiter

    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.addFilter(RepeatLimiter())
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


async def serve_role(role: Any, *, host: str, port: int, security: Security, base_path: str = "/",
                     ready: str = "") -> None:
    """Start ``role``, serve its handler, and run until SIGINT or SIGTERM."""
    from sdcp_fast.transport.h2server import serve

    handler: Handler = role.handler  # insecure: requests reach it with no identity (the module doc)
    server = await serve(handler, host, port, ssl=security.server_context(), insecure=security.insecure,
                         base_path=base_path)
    log.info("%s: listening on %s:%d; starting the role", ready or type(role).__name__, host, server.port)
    await role.start()
    scheme = "http" if security.insecure else "https"
    try:
        await serve_until_signal(server, lambda: print(
            f"{ready or type(role).__name__}: serving {scheme}://{host}:{server.port}{base_path} "
            f"({'INSECURE: no authentication' if security.insecure else 'HTTP/2, TLS 1.3, client certificates required'})",
            file=sys.stderr, flush=True))
    finally:
        await role.close()


async def serve_until_signal(server: Any, ready: Callable[[], None]) -> None:
    """Once SIGINT and SIGTERM are caught, call ``ready`` (the service announces itself) and
    wait for one of them; then close ``server``, giving its connections 5 s to finish."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    ready()
    try:
        await stop.wait()
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)
