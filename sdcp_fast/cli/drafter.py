"""``sdcp-fast drafter``: a drafter role as a service (Table 1: POST assignments) over HTTP/2
with mutual TLS."""

from __future__ import annotations

import argparse

HELP = "serve an SDCP drafter role (proposes tokens from a draft model)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.deploy.catalog import add_device_argument
    from sdcp_fast.deploy.service import add_service_arguments

    p.add_argument("--drafter", default="ngram",
                   help="ngram | layerskip:L | model:PATH|NAME (toy target: ngram, toy-good, toy-weak)")
    p.add_argument("--model", default="auto", help="the target this drafter serves (its vocabulary, and the "
                                                   "weights layerskip shares); default auto")
    p.add_argument("--m", type=int, default=None,
                   help="tokens proposed per round (default: chosen by §6.2 from measured acceptance and costs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drafter's own sampling (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_device_argument(p)
    add_service_arguments(p, name="drafter-a", port=8511)


def run(args: argparse.Namespace) -> int:
    import sys

    from sdcp_fast.deploy.catalog import load_drafter, load_target
    from sdcp_fast.deploy.service import Security, configure_logging, listen_address

    configure_logging(args.log_level)
    try:
        security = Security.from_args(args, "drafter-a")
        drafter, _ = load_drafter(args.drafter, load_target(args.model, args.device))
    except (FileNotFoundError, ValueError) as exc:
        print(f"sdcp-fast drafter: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from sdcp_fast.transport.loop import run as run_loop

    host, port = listen_address(args)
    return run_loop(_serve(args, drafter, security, host, port)) or 0


async def _serve(args: argparse.Namespace, drafter: object, security: object, host: str, port: int) -> int:
    from sdcp_fast.deploy.service import RemoteStore, client_transport, serve_role
    from sdcp_fast.protocol.peer import Peer, PeerRole
    from sdcp_fast.roles.drafter import DrafterRole

    role = DrafterRole(
        drafter, uri=args.uri, mlc=RemoteStore(args.mlc, security),  # type: ignore[arg-type]
        transport=client_transport(security, Peer(args.uri, PeerRole.DRAFTER)),  # type: ignore[arg-type]
        router=args.router, seed=args.seed, fixed_m=args.m, offload=True, status_ttl_ms=args.status_ttl_ms)
    await serve_role(role, host=host, port=port, security=security,  # type: ignore[arg-type]
                     ready=f"sdcp-fast drafter ({args.drafter})")
    return 0
