#!/usr/bin/env bash
# Kernel checks on a CUDA machine, in under 5 minutes:
#   1. the kernel tests with the triton backend on the GPU (TRITON_INTERPRET off: the tests
#      then put the triton backend's inputs on CUDA; the statistical tests include triton);
#   2. bench/kernels.py --device cuda (triton vs HBM copy bandwidth and the reference), which
#      also times FlashInfer's chain_speculative_sampling on the same shapes if it imports.
# Results land in ${OUT:-bench/results}: pytest log, kernels-cuda.json, kernels-cuda.png.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
"$PY" - <<'PY' || exit 2
import torch, triton
assert torch.cuda.is_available(), "no CUDA device"
print("gpu:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| triton", triton.__version__)
try:
    import flashinfer
    print("flashinfer", flashinfer.__version__)
except Exception as exc:  # noqa: BLE001
    print("flashinfer not importable:", exc)
PY
status=0
timeout 170 "$PY" -m pytest tests/kernels -q -x -k "triton or readme" -p no:cacheprovider -rs \
    2>&1 | tee "$OUT/gpu-tests.log" | tail -25 || status=1
timeout 110 "$PY" bench/kernels.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/gpu-bench.log" || status=1
exit $status
