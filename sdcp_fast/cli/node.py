"""``sdcp-fast node``: one host's part of a cluster (its etcd member, MLC node and roles), as
the cluster spec places them (sdcp_fast/cluster/host_part.py)."""

from __future__ import annotations

import argparse

HELP = "run one host's part of a cluster: its etcd member, its MLC node and its roles, from a cluster spec"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, metavar="FILE", help="the cluster spec (TOML)")
    p.add_argument("--host", required=True, metavar="NAME", help="this host's name in the spec")
    p.add_argument("--dir", metavar="DIR", help="folder with certs/ (from `sdcp-fast cluster certs`); gets logs/ "
                                                "and NAME/ (default: the spec's folder)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for every process (default 180)")


def run(args: argparse.Namespace) -> int:
    import logging
    import sys
    from pathlib import Path

    from sdcp_fast.cluster.host_part import run_node
    from sdcp_fast.cluster.spec import load

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        spec = load(args.spec)
        spec.host(args.host)
    except (OSError, ValueError) as exc:
        print(f"sdcp-fast node: {exc}", file=sys.stderr)
        return 2
    directory = Path(args.dir) if args.dir else Path(args.spec).resolve().parent
    return run_node(spec, args.host, directory.resolve(), args.timeout)
