"""``sdcp-fast router``: the router role as a service (Table 1: instances/{id}/status, events)
over HTTP/2 with mutual TLS; it opens sessions, assigns drafters and fails verifiers over."""

from __future__ import annotations

import argparse

HELP = "serve the SDCP router role (status table, assignment, events, fail-over)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.deploy.service import add_service_arguments

    p.add_argument("--model", default="auto", help="the target model (its digests go into contracts); default auto")
    p.add_argument("--drafter-model", action="append", default=[], metavar="URI=SPEC",
                   help="a drafter instance and the model it serves, as a drafter spec (ngram, model:NAME, ...) "
                        "or a 64-hex-digit digest; repeat per drafter")
    p.add_argument("--scope", help="the KVSP scope of this router's sessions, 32 hex digits (default random)")
    add_service_arguments(p, name="router", port=8500, router=False)


def drafter_models(entries: list[str], target: object) -> dict[str, bytes]:
    from sdcp_fast.deploy.catalog import load_drafter

    models = {}
    for entry in entries:
        uri, sep, spec = entry.rpartition("=")
        if not sep or not uri:
            raise ValueError(f"expected URI=SPEC, got {entry!r}")
        if len(spec) == 64 and all(c in "0123456789abcdef" for c in spec.lower()):
            models[uri] = bytes.fromhex(spec)
        else:
            models[uri] = load_drafter(spec, target)[1]  # type: ignore[arg-type]
    return models


def run(args: argparse.Namespace) -> int:
    import sys

    from sdcp_fast.deploy.catalog import load_target
    from sdcp_fast.deploy.service import Security, configure_logging, listen_address

    configure_logging(args.log_level)
    try:
        security = Security.from_args(args, "router")
        target = load_target(args.model)
        models = drafter_models(args.drafter_model, target)
        scope = bytes.fromhex(args.scope) if args.scope else None
    except (FileNotFoundError, ValueError) as exc:
        print(f"sdcp-fast router: {exc}", file=sys.stderr)
        return 2
    from sdcp_fast.transport.loop import run as run_loop

    host, port = listen_address(args)
    return run_loop(_serve(args, target, models, scope, security, host, port)) or 0


async def _serve(args: argparse.Namespace, target: object, models: dict[str, bytes], scope: bytes | None,
                 security: object, host: str, port: int) -> int:
    from sdcp_fast.deploy.service import RemoteStore, client_transport, serve_role
    from sdcp_fast.protocol.peer import Peer, PeerRole
    from sdcp_fast.roles.router import RouterRole

    role = RouterRole(
        uri=args.uri, mlc=RemoteStore(args.mlc, security),  # type: ignore[arg-type]
        transport=client_transport(security, Peer(args.uri, PeerRole.ROUTER)),  # type: ignore[arg-type]
        target_digest=target.digest, tokenizer_digest=target.tokenizer_digest,  # type: ignore[attr-defined]
        drafter_models=models, scope=scope)
    from sdcp_fast.roles.frontend import HFTokenizer, ToyWords, mount_frontend

    loaded = target.loaded  # type: ignore[attr-defined]
    tokenizer = ToyWords() if loaded is None else HFTokenizer(loaded.tokenizer)
    mount_frontend(role, tokenizer, stop=target.stop, model=target.name)  # type: ignore[attr-defined]
    await serve_role(role, host=host, port=port, security=security,  # type: ignore[arg-type]
                     ready=f"sdcp-fast router ({len(models)} drafters registered)")
    return 0
