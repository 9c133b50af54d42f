#!/usr/bin/env bash
# Refresh requirements/lock.txt: the exact version and hashes of every package the dev set pulls in
# (pyproject.toml's dependencies and its dev extra, plus what building the extension in place needs).
# torch is resolved as the pinned CPU build, so the lock holds its dependencies but not the CUDA
# build's nvidia packages, and is left out itself: bootstrap installs it (or keeps the user's build).
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=${UV_VERSION:-0.13.9}
TORCH_PIN=${SDCP_TORCH_PIN:-2.13.0}
# Where the CPU wheel of torch lies when the package index has only the CUDA build under the plain version.
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools/venv"
"$tools/venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
links=()
torch=torch==$TORCH_PIN
if compgen -G "$TORCH_WHEELS/torch-$TORCH_PIN+cpu-*.whl" >/dev/null; then
  links=(--find-links "$TORCH_WHEELS")
  torch=torch==$TORCH_PIN+cpu
fi
"$tools/venv/bin/uv" pip compile pyproject.toml requirements/build.in --extra dev \
  --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  "${links[@]}" --override <(echo "$torch") --no-emit-package torch \
  --custom-compile-command "make lock" -q -o requirements/lock.txt
echo "lock: requirements/lock.txt ($(grep -c '==' requirements/lock.txt) packages)"
