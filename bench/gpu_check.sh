#!/usr/bin/env bash
# The GPU check, one script, under 8 minutes on a bare H200 whose Python has torch,
# triton, transformers, pytest and hypothesis (each step has its own time limit; they sum to 490 s,
# so a run that needs every one of them in full ends 10 s past 8 minutes):
#   0. installs what the machine lacks from wheels in .whl/ (no network there), FlashInfer from
#      its sdist when present (its sampling module JIT-builds on first call, about 50 s);
#   1. builds the C++ extension in place;
#   2. runs the CUDA tests: tests/kernels on the GPU (triton compiled, CUDA-graph capture,
#      no-sync, the statistical tests), the CUDA variants in tests/model (the runner's paged
#      attention and CUDA graphs among them), tests/cache, and generate / demo --device cuda;
#   3. bench/verify_kernels.py --device cuda (triton vs vllm_style, FlashInfer, the HBM copy bandwidth);
#   4. bench/model.py --synthetic llama-3.2-1b --device cuda (the model runner: paged attention,
#      CUDA graphs, against HF transformers on the same random weights; no checkpoint travels)
#      and the MLC device bench when it takes --device.
# Results land in ${OUT:-bench/results}: logs, kernels-cuda.json/.png, model/MLC JSON, and
# measured-commit.txt (the commit they measured). Exit status: 0 when every step passed.
#
# Bring the wheels (on a machine with network; python 3.12, manylinux x86_64):
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
#       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
#       --no-deps -d .whl gguf cbor2 pybind11 h2 hpack hyperframe
#   pip download --no-binary=:all: --no-deps -d .whl flashinfer-python==0.3.1.post1   # sdist, 3.8 MB
#   (optional, for the PNG plots: add matplotlib contourpy cycler fonttools kiwisolver pyparsing
#   pillow python-dateutil to the first command; without them the JSON is still written)
# and pass .whl (git-ignored) along with the tree; `git rev-parse HEAD > .measured-commit` too
# when the tree travels without .git.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
status=0
step() { echo "== $1 ($((SECONDS - start)) s)"; }

(git rev-parse HEAD 2>/dev/null || cat .measured-commit 2>/dev/null || echo unknown) > "$OUT/measured-commit.txt"

step "0. wheels"
if compgen -G ".whl/*.whl" > /dev/null; then
    timeout 20 "$PY" -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -3
fi
if compgen -G ".whl/flashinfer*.tar.gz" > /dev/null; then
    timeout 40 "$PY" -m pip install -q --no-build-isolation --no-deps .whl/flashinfer*.tar.gz 2>&1 | tail -3
fi
"$PY" - <<'PY' 2>&1 | tee "$OUT/gpu-env.txt" || exit 2
import importlib, torch, triton
assert torch.cuda.is_available(), "no CUDA device"
print("gpu:", torch.cuda.get_device_name(), "| torch", torch.__version__, "| triton", triton.__version__)
for name in ("flashinfer", "gguf", "cbor2", "pybind11", "transformers", "matplotlib", "kvikio"):
    try:
        mod = importlib.import_module(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as exc:  # noqa: BLE001
        print(name, "not importable:", type(exc).__name__, exc)
PY

step "1. build"
# sdcp_fast.triton_kernels exists only once installed (setup.py maps triton_kernels/ onto it)
# (the editable install builds the C++ extension too)
if ! "$PY" -c "import sdcp_fast.triton_kernels" 2>/dev/null; then
    timeout 90 "$PY" -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/gpu-build.log" 2>&1 \
        || { status=1; tail -5 "$OUT/gpu-build.log"; }
else
    timeout 90 "$PY" setup.py -q build_ext --inplace > "$OUT/gpu-build.log" 2>&1 || { status=1; tail -5 "$OUT/gpu-build.log"; }
fi
"$PY" -c "import sdcp_fast.triton_kernels" || status=1
"$PY" -c "import sdcp_fast.native as n; print(n.status())"

step "2. CUDA tests"
timeout 120 "$PY" -m pytest tests/kernels -q -p no:cacheprovider -rs -m "not slow" \
    2>&1 | tee "$OUT/gpu-tests-kernels.log" | tail -15 || status=1
timeout 60 "$PY" -m pytest tests/model tests/cache tests/cli/test_device.py -q -p no:cacheprovider -rs \
    -k "cuda or device or paged" \
    2>&1 | tee "$OUT/gpu-tests-model-cache.log" | tail -8 || status=1

step "3. kernel bench"
timeout 120 "$PY" bench/verify_kernels.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/gpu-bench-kernels.log" || status=1

step "4. model and MLC bench"
# The runner on a Llama-3.2-1B-shaped model with random weights (bf16, 128-token contexts):
# decode steps eager and from CUDA graphs at B=1/16/64, a verify pass of M + 1 = 5 rows, HF
# transformers' greedy generate on the same weights; runner-llama-3.2-1b-cuda-triton.json.
timeout 60 "$PY" bench/model.py --synthetic llama-3.2-1b --device cuda --batches 1,16,64 --steps 16 --out "$OUT" \
    2>&1 | tee "$OUT/gpu-bench-model.log" | tail -8 || status=1
if "$PY" bench/mlc.py --help 2>/dev/null | grep -q -- "--device"; then
    timeout 20 "$PY" bench/mlc.py --device cuda --quick --no-services 2>&1 | tee "$OUT/gpu-bench-mlc.log" | tail -15 \
        || status=1
else
    echo "bench/mlc.py takes no --device yet: skipped" | tee "$OUT/gpu-bench-mlc.log"
fi

step "done, status $status"
exit $status
