"""A real etcd on loopback with a temporary data dir, for the tests that need one."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sdcp_fast.deploy.up import free_port


@contextmanager
def running_etcd(*, unsafe_no_fsync: bool = False) -> Iterator[tuple[str, int]]:
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd binary missing: scripts/services.sh installs Debian's etcd-server")
    client, peer = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="sdcp-etcd-")
    cmd = [
        binary, "--name", "t", "--data-dir", data,
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"t=http://127.0.0.1:{peer}", "--log-level", "error",
    ]
    if unsafe_no_fsync:
        cmd.append("--unsafe-no-fsync")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                pytest.fail(f"etcd did not become healthy: {err}")
            time.sleep(0.1)
        yield "127.0.0.1", client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)
