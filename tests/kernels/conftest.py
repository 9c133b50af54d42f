"""Backends under test: every backend that can run here, each compared with the reference.

Without a GPU the triton backend runs on CPU tensors through triton's interpreter, so
TRITON_INTERPRET is set before anything imports triton (it is read at decoration time).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
