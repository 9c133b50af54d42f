"""``sdcp-fast certs DIR``: a development CA and per-instance certificates (mTLS, §5.1)."""

from __future__ import annotations

import argparse

HELP = "make a development CA and per-instance certificates with SDCP identity SANs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="folder for ca.pem, ca.key, NAME.pem and NAME.key")
    parser.add_argument(
        "--instance", action="append", default=[], metavar="NAME=ROLE[:URI]",
        help="an instance certificate, e.g. verifier=verifier:https://127.0.0.1:8501/ (repeatable; "
             "default: router, verifier, verifier-standby, drafter-a, drafter-b, mlc, client on loopback)")
    parser.add_argument("--days", type=int, default=825, help="validity of instance certificates (default 825)")


def run(args: argparse.Namespace) -> int:
    import sys

    from sdcp_fast.transport.certs import DEFAULT_INSTANCES, InstanceSpec, write_certificates

    try:
        specs = [InstanceSpec.parse(text) for text in args.instance] or list(DEFAULT_INSTANCES)
        written = write_certificates(args.dir, specs, days=args.days)
    except ValueError as exc:
        print(f"sdcp-fast certs: {exc}", file=sys.stderr)
        return 2
    print(f"CA: {args.dir}/ca.pem (key ca.key; keep it private)")
    for spec in specs:
        cert, key = written[spec.name]
        print(f"{spec.name}: {cert} {key}  role {spec.role.value}" + (f"  {spec.uri}" if spec.uri else ""))
    return 0
