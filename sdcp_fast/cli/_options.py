"""Options that several subcommands share, with the same words everywhere."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_device_argument(p: argparse.ArgumentParser) -> None:
    """``--device`` (and ``--weights``) on the commands that load a model."""
    p.add_argument("--device", default="cpu",
                   help="where the model runs: cpu (default), cuda or cuda:N (paged attention and CUDA graphs)")
    add_weights_argument(p)


def add_weights_argument(p: argparse.ArgumentParser) -> None:
    """``--weights`` (see ``model/quant_weights.py``): every process that loads the target
    (verifier, drafter, router) must use the same form, since the weights digest follows it."""
    p.add_argument("--weights", default="auto", choices=("auto", "f32", "bf16", "q8_0", "q4"),
                   help="form of the linear layers: auto (f32: rule-1 output equal to target-only decoding), f32, bf16, "
                        "q8_0 or q4 (quantized kernels, CPU only; see docs/kernels.md)")


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """``--etcd`` and ``--cluster`` of a verifier or drafter in a cluster (the router has its own)."""
    p.add_argument("--etcd", metavar="HOST:PORT[,...]",
                   help="a cluster's etcd members (sdcp-fast node gives them, with --cluster): --mlc is this "
                        "host's MLC node, and objects that name another of the cluster's registered nodes are "
                        "read there")
    p.add_argument("--cluster", metavar="TOKEN", help="the cluster's name in etcd (its spec's token); with --etcd")


def mlc_nodes(args: argparse.Namespace) -> Callable[[], list[str]] | None:
    """With ``--etcd``: a reader of the cluster's MLC nodes (base URIs) from its membership
    registry (blocking); None outside a cluster. ValueError without ``--cluster``."""
    if not getattr(args, "etcd", None):
        return None
    if not args.cluster:
        raise ValueError("--etcd needs --cluster (the cluster's token)")
    from sdcp_fast.cluster.etcd_client import parse_endpoints
    from sdcp_fast.cluster.membership_etcd import Membership

    registry = Membership(args.cluster, parse_endpoints(args.etcd))
    return lambda: [m.uri for m in registry.members("mlc")]
