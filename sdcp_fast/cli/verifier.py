"""``sdcp-fast verifier``: the verifier role as a service (Table 1: sessions, drafter, proposals,
output, policy) over HTTP/2 with mutual TLS."""

from __future__ import annotations

import argparse

HELP = "serve the SDCP verifier role (the target model; the only party that commits output)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.deploy.catalog import add_device_argument
    from sdcp_fast.deploy.service import add_service_arguments

    p.add_argument("--model", default="auto", help="target: toy, smollm2, a GGUF file or an HF directory "
                                                   "(default auto: smollm2 when installed, else toy)")
    p.add_argument("--backend", default="auto", help="kernel backend: auto, reference, cpu, triton")
    p.add_argument("--max-batch", type=int, default=64, help="sessions per scoring pass at most (default 64)")
    p.add_argument("--batch-wait-ms", type=float, default=5.0,
                   help="how long a batch waits for the sessions that owe a proposal (default 5 ms)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_device_argument(p)
    add_service_arguments(p, name="verifier", port=8501)


def run(args: argparse.Namespace) -> int:
    import sys

    from sdcp_fast.deploy.catalog import load_target
    from sdcp_fast.deploy.service import Security, configure_logging, listen_address

    configure_logging(args.log_level)
    try:
        security = Security.from_args(args, "verifier")
        target = load_target(args.model, args.device)
    except (FileNotFoundError, ValueError) as exc:
        print(f"sdcp-fast verifier: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from sdcp_fast.transport.loop import run as run_loop

    host, port = listen_address(args)
    return run_loop(_serve(args, target, security, host, port)) or 0


async def _serve(args: argparse.Namespace, target: object, security: object, host: str, port: int) -> int:
    from sdcp_fast.deploy.service import RemoteStore, client_transport, serve_role
    from sdcp_fast.protocol.peer import Peer, PeerRole
    from sdcp_fast.roles.verifier import VerifierRole

    role = VerifierRole(
        target.scorer, uri=args.uri, mlc=RemoteStore(args.mlc, security),  # type: ignore[attr-defined,arg-type]
        transport=client_transport(security, Peer(args.uri, PeerRole.VERIFIER)),  # type: ignore[arg-type]
        target_digest=target.digest, router=args.router, backend=args.backend,  # type: ignore[attr-defined]
        max_batch=args.max_batch, batch_wait=args.batch_wait_ms / 1000, offload=True, status_ttl_ms=args.status_ttl_ms)
    await serve_role(role, host=host, port=port, security=security,  # type: ignore[arg-type]
                     ready=f"sdcp-fast verifier ({target.describe})")  # type: ignore[attr-defined]
    return 0
