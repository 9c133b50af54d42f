"""Model identity for session contracts (§4.1): ``target`` / ``drafters`` and ``tokenizer``
hash32 values. The target digest is the weights digest below for every family; the §6.1
check that a contract names the model a verifier serves is ``VerifierSession.open``'s.

Weights digest (canonical byte order, see docs/models.md)::

    SHA-256( "SDCP-WEIGHTS-1" 0x00
             for each tensor, by Hugging Face name in ascending byte order:
               name (UTF-8) 0x00 dtype ("F32" | "BF16" | "F16" | "I64") 0x00
               uint32(ndim) uint32(dim_0) .. uint32(dim_n-1) uint64(nbytes)
               the values, row-major, each little-endian )

over the tensors *as loaded* (a GGUF's dequantized float32 values, not its quantized
blocks), so two loaders of one checkpoint agree exactly when they compute the same weights.
Names are the family's own (Gemma's four norms per layer, Phi-3's fused projections).
A tied output head is not a tensor of its own; a reduced draft head's token ids
(``sdcp_fast.head_ids``, I64) are one. Integers are big-endian (network order).

Tokenizer digest: SHA-256 of "SDCP-TOKENIZER-1" 0x00 and the tokenizer's ``tokenizers``
JSON definition re-serialized canonically (sorted keys, no whitespace, UTF-8).
"""

from __future__ import annotations

import hashlib
import json
import struct

import torch
from tokenizers import Tokenizer

from . import weights
from .llama import Transformer

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


def weights_digest(model: Transformer) -> bytes:
    h = hashlib.sha256(b"SDCP-WEIGHTS-1\x00")
    state = {weights.to_hf_name(k, model.cfg.family): v for k, v in model.state_dict().items()}
    for name in sorted(state, key=lambda n: n.encode()):
        t = state[name].detach().cpu().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""  # native order: little-endian hosts
        h.update(name.encode() + b"\x00" + _DTYPES[t.dtype].encode() + b"\x00")
        h.update(struct.pack(f">I{t.dim()}I", t.dim(), *t.shape) + struct.pack(">Q", len(raw)))
        h.update(raw)
    return h.digest()


def tokenizer_digest(tok: Tokenizer) -> bytes:
    canon = json.dumps(json.loads(tok.to_str()), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(b"SDCP-TOKENIZER-1\x00" + canon.encode()).digest()


def model_digest(name: str) -> bytes:
    """A stand-in hash32 for components that have no weights to hash (toys, n-gram)."""
    return hashlib.sha256(f"sdcp-fast:{name}".encode()).digest()


def scorer_digest(scorer: object, name: str = "target") -> bytes:
    """The weights digest of a scorer's model (``scorer.model``, a ``Transformer``), else the
    stand-in of ``name`` (a toy has no weights)."""
    model = getattr(scorer, "model", None)
    return weights_digest(model) if isinstance(model, Transformer) else model_digest(name)


def drafter_digest(drafter: object, scorer: object = None) -> bytes:
    """A drafter's entry in a contract's ``drafters``: the weights digest of a model of its own
    (``drafter.runner.model``), else the stand-in of its name (n-gram, toys, the target's
    own layers skipped: ``scorer.model``)."""
    model = getattr(getattr(drafter, "runner", None), "model", None)
    if isinstance(model, Transformer) and model is not getattr(scorer, "model", None):
        return weights_digest(model)
    return model_digest(str(getattr(drafter, "name", "drafter")))
