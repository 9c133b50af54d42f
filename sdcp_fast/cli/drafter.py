"""``sdcp-fast drafter``: a drafter role as a service (Table 1: POST assignments) over HTTP/2
with mutual TLS."""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING

from sdcp_fast.protocol.peer import PeerRole

if TYPE_CHECKING:
    from sdcp_fast.model.interfaces import Drafter
    from sdcp_fast.roles.drafter import DrafterRole
    from sdcp_fast.store.interface import Store
    from sdcp_fast.transport.base import Transport

HELP = "serve an SDCP drafter role (proposes tokens from a draft model)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.cli._options import add_cluster_arguments, add_device_argument
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
    add_cluster_arguments(p)


def run(args: argparse.Namespace) -> int:
    from sdcp_fast.cli._options import mlc_nodes
    from sdcp_fast.deploy.catalog import load_drafter, load_target
    from sdcp_fast.deploy.service import run_role

    return run_role(args, PeerRole.DRAFTER, lambda: load_drafter(args.drafter, load_target(args.model, args.device, args.weights))[0],
                    partial(_role, args), lambda _: args.drafter, mlc_nodes)


def _role(args: argparse.Namespace, drafter: Drafter, store: Store, transport: Transport) -> DrafterRole:
    from sdcp_fast.roles.drafter import DrafterRole

    return DrafterRole(drafter, uri=args.uri, mlc=store, transport=transport, router=args.router, seed=args.seed,
                       fixed_m=args.m, offload=True, status_ttl_ms=args.status_ttl_ms)
