"""``sdcp-fast conform URL``: check an SDCP verifier (or, with ``--role``, a drafter or router)
from outside, over HTTP/2 + mutual TLS, against the draft (docs/conformance.md)."""

from __future__ import annotations

import argparse

HELP = "check an SDCP instance from outside against the draft (black-box conformance kit)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sdcp_fast.conform.kit import GROUPS

    parser.add_argument("url", metavar="URL", help="base URI of the instance under test, e.g. https://127.0.0.1:8501/")
    parser.add_argument("--certs", required=True, metavar="DIR",
                        help="a `sdcp-fast certs` folder of the deployment's CA: ca.pem and the two identities below")
    parser.add_argument("--router-cert", default="router", metavar="NAME",
                        help="NAME.pem/NAME.key in DIR with the router role (default router)")
    parser.add_argument("--drafter-cert", default="drafter-a", metavar="NAME",
                        help="NAME.pem/NAME.key in DIR with the drafter role and a base URI (default drafter-a)")
    parser.add_argument("--role", choices=("verifier", "drafter", "router"), default="verifier")
    parser.add_argument("--target-digest", metavar="HEX",
                        help="the verifier's model digest (64 hex digits); without it only refusals are checked")
    parser.add_argument("--vocab", type=int, metavar="V", help="the target's vocabulary size (rule-2 q rows)")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--mlc", metavar="URL",
                       help="an sdcp-fast MLC serving q rows, committed tokens and commit logs (rule 2, resume, "
                            "fencing)")
    store.add_argument("--store", metavar="MODULE:FACTORY",
                       help="another deployment's cache and commit log: FACTORY() returns an object with the "
                            "adapter coroutines of sdcp_fast/conform/adapters.py (docs/conformance.md)")
    parser.add_argument("--oracle", metavar="MODULE:FACTORY",
                        help="the target's logits, for rule 2 with a seed above temperature 0: FACTORY() returns an "
                             "object with logits(context, proposal) (sdcp_fast/conform/oracles.py; "
                             "sdcp_fast.conform.oracles:toy for --model toy)")
    parser.add_argument("--only", metavar="GROUP", action="append", choices=GROUPS,
                        help=f"run only these parts of the kit (repeatable): {', '.join(GROUPS)}")
    parser.add_argument("--vectors", metavar="DIR",
                        help="the published vectors (contracts.json, prefix.json; default: tests/vectors of a "
                             "source checkout)")
    parser.add_argument("--quotes", action="store_true", help="print the draft's sentence under each check")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    try:
        report = asyncio.run(conform(args))
    except (OSError, ValueError) as exc:
        print(f"sdcp-fast conform: {exc}", file=sys.stderr)
        return 2
    print(report.json() if args.json else report.text(quotes=args.quotes))  # type: ignore[attr-defined]
    return 1 if report.failed else 0  # type: ignore[attr-defined]


async def conform(args: argparse.Namespace) -> object:
    import ssl

    from sdcp_fast.conform.adapters import load_store, remote_mlc_store
    from sdcp_fast.conform.client import Answer, Identities, certificate_peer
    from sdcp_fast.conform.kit import GROUPS, Conform
    from sdcp_fast.conform.oracles import load_oracle
    from sdcp_fast.conform.other_roles import check_other_role
    from sdcp_fast.conform.probes import probe
    from sdcp_fast.conform.report import Report
    from sdcp_fast.transport.certs import instance_files
    from sdcp_fast.transport.h2client import H2Transport
    from sdcp_fast.transport.tls import ALPN_H2, client_context

    router_files = instance_files(args.certs, args.router_cert)
    drafter_files = instance_files(args.certs, args.drafter_cert)
    ids = Identities(router=certificate_peer(router_files[0]), drafter=certificate_peer(drafter_files[0]))
    if ids.drafter.uri is None:
        raise ValueError(f"{drafter_files[0]} names no single base URI; a drafter needs one (§6.1 assignments)")
    router_t = H2Transport(client_context(*router_files), timeout=args.timeout)
    drafter_t = H2Transport(client_context(*drafter_files), timeout=args.timeout)
    bare = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=router_files[2])
    bare.minimum_version = ssl.TLSVersion.TLSv1_3
    bare.set_alpn_protocols([ALPN_H2])
    stranger_t = H2Transport(bare, timeout=args.timeout)
    store = None

    def sender(transport: H2Transport):  # type: ignore[no-untyped-def]
        async def send(method: str, path: str, body: bytes = b"", query: dict[str, str] | None = None) -> Answer:
            headers = {"content-type": "application/sdcp+cbor"} if body else {}
            response = await transport.request(args.url, method, path, body=body, query=query, headers=headers)
            return Answer(response.status, response.body, response.content_type)
        return send

    try:
        if args.role != "verifier":
            report = Report(args.url, args.role)
            await check_other_role(args.role, report, as_router=sender(router_t), as_drafter=sender(drafter_t),
                                   ids=ids)
            return report
        if args.mlc:
            store = remote_mlc_store(args.mlc, client_context(*drafter_files), client_context(*router_files))
        elif args.store:
            store = load_store(args.store)
        digest = bytes.fromhex(args.target_digest) if args.target_digest else None
        kit = Conform(args.url, as_router=sender(router_t), as_drafter=sender(drafter_t), ids=ids,
                      target_digest=digest, vocab=args.vocab, store=store, stranger=sender(stranger_t),
                      vectors=args.vectors, probe=lambda: probe(args.url, *drafter_files, timeout=args.timeout),
                      oracle=load_oracle(args.oracle) if args.oracle else None)
        return await kit.run(tuple(args.only) if args.only else GROUPS)
    finally:
        for t in (router_t, drafter_t, stranger_t):
            await t.close()
        if store is not None and hasattr(store, "aclose"):
            await store.aclose()
