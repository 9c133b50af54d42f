"""``sdcp-fast verifier``: the verifier role as a service (Table 1: sessions, drafter, proposals,
output, policy) over HTTP/2 with mutual TLS."""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING

from sdcp_fast.protocol.peer import PeerRole

if TYPE_CHECKING:
    from sdcp_fast.deploy.catalog import Target
    from sdcp_fast.roles.verifier import VerifierRole
    from sdcp_fast.store.interface import Store
    from sdcp_fast.transport.base import Transport

HELP = "serve the SDCP verifier role (the target model; the only party that commits output)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.cli._options import add_cluster_arguments, add_device_argument
    from sdcp_fast.deploy.service import add_service_arguments

    p.add_argument("--model", default="auto", help="target: toy, smollm2, a GGUF file or an HF directory "
                                                   "(default auto: smollm2 when installed, else toy)")
    p.add_argument("--backend", default="auto", help="kernel backend: auto, reference, cpu, triton")
    p.add_argument("--max-batch", type=int, default=64, help="sessions per scoring pass at most (default 64)")
    p.add_argument("--batch-wait-ms", type=float, default=5.0,
                   help="how long a batch waits for the sessions that owe a proposal (default 5 ms)")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="prompt tokens one scoring pass feeds at most, beside its decoding rounds; a longer "
                        "prompt is fed in chunks over several passes (default: 512 on a GPU, 32 on the CPU; "
                        "0: in one pass)")
    p.add_argument("--prefill-solo", type=int, default=None,
                   help="prompt tokens a scoring pass feeds at most when no decoding round shares it (default: "
                        "4096 on a GPU, 512 on the CPU; 0: the rest in one pass)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_device_argument(p)
    add_service_arguments(p, name="verifier", port=8501)
    add_cluster_arguments(p)


def run(args: argparse.Namespace) -> int:
    from sdcp_fast.cli._options import mlc_nodes
    from sdcp_fast.deploy.service import run_role

    return run_role(args, PeerRole.VERIFIER, partial(_load, args), partial(_role, args),
                    lambda target: target.describe, mlc_nodes)


def _load(args: argparse.Namespace) -> Target:
    """The target, and its kernel backend built now (a CPU build compiles C++): a first pass
    would otherwise build it, with sessions waiting."""
    import logging

    import torch

    from sdcp_fast.deploy.catalog import load_target
    from sdcp_fast.kernels.backends import load, resolve

    target = load_target(args.model, args.device, args.weights)
    backend = resolve(args.backend, torch.device(args.device))
    logging.getLogger("sdcp_fast.deploy").info("sdcp-fast verifier: building kernels (%s backend)", backend)
    load(backend)
    if backend == "cpu":
        from sdcp_fast import native

        native.module()  # built (or loaded) here rather than in the first scoring pass
    return target


def _role(args: argparse.Namespace, target: Target, store: Store, transport: Transport) -> VerifierRole:
    from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole

    config = VerifierConfig(uri=args.uri, target_digest=target.digest, router=args.router, backend=args.backend,
                            max_batch=args.max_batch, batch_wait=args.batch_wait_ms / 1000, offload=not target.inline,
                            status_ttl_ms=args.status_ttl_ms, max_prompt=target.context,
                            prefill_chunk=args.prefill_chunk, prefill_solo=args.prefill_solo)
    return VerifierRole(target.scorer, config, mlc=store, transport=transport)
