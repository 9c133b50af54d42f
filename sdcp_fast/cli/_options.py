"""Options that several subcommands share, with the same words everywhere."""

from __future__ import annotations

import argparse


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
