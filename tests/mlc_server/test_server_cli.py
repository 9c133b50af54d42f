"""`sdcp-fast mlc` as a process: HTTP/2 + mTLS on loopback by default (HTTP/1.1 with
--http1), objects and commit logs, clean stop; no start without TLS unless --insecure."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.http_client import RemoteMLC
from sdcp_fast.commitlog.http import HttpCommitLog
from sdcp_fast.deploy.up import free_port
from sdcp_fast.protocol.commitlog import FenceRecord
from sdcp_fast.transport.tls import client_context
from tests.store.certkit import make_certs


@pytest.mark.parametrize("wire", ["h2", "http1"])
def test_serves_over_mutual_tls_and_stops_on_sigterm(tmp_path, wire):
    certs = make_certs(tmp_path)
    port = free_port()
    http1 = wire == "http1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdcp_fast", "mlc", "--port", str(port), "--root", str(tmp_path / "root"),
         "--host-mib", "4", "--disk-mib", "8", "--cert", certs["server_cert"], "--key", certs["server_key"],
         "--ca", certs["ca"], *(["--http1"] if http1 else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "sdcp-fast mlc did not listen"
                time.sleep(0.1)
        ctx = client_context(certs["client_cert"], certs["client_key"], certs["ca"])
        uri = object_uri(bytes(16), b"s" * 16, "q_rows", 1)
        with RemoteMLC(f"https://127.0.0.1:{port}", ssl=ctx, http1=http1) as mlc:
            mlc.put(uri, b"rows", lease_ttl=30)
            assert bytes(mlc.get(uri)) == b"rows"
        router = client_context(certs["router_cert"], certs["router_key"], certs["ca"])
        log = HttpCommitLog.on_server(f"https://127.0.0.1:{port}", object_uri(bytes(16), b"s" * 16, "commit_log"),
                                      ssl=router, http1=http1)
        assert log.append(FenceRecord(1), '"0"') == '"1"'
        log.close()
        assert (tmp_path / "root" / "logs").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert f"serving https://127.0.0.1:{port}" in out and "client certificates required" in out
    assert ("HTTP/1.1" if http1 else "HTTP/2") in out


def _refused(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "sdcp_fast", "mlc", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stderr


def test_refuses_to_start_without_tls_unless_insecure_and_then_on_loopback_only(tmp_path):
    assert "--insecure" in _refused("--root", str(tmp_path))
    assert "loopback" in _refused("--root", str(tmp_path), "--insecure", "--host", "0.0.0.0")


def test_insecure_serves_h2c_on_loopback_and_says_so(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sdcp_fast", "mlc", "--port", str(port), "--root",
                             str(tmp_path / "root"), "--insecure"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []  # start-up progress and the warning, until the address (or the end)
        while not lines or (lines[-1] and "serving" not in lines[-1]):
            lines.append(proc.stdout.readline())
        assert f"serving http://127.0.0.1:{port}" in lines[-1] and "INSECURE" in lines[-1], lines
        with RemoteMLC(f"http://127.0.0.1:{port}") as mlc:
            uri = object_uri(bytes(16), b"s" * 16, "q_rows", 1)
            mlc.put(uri, b"rows")
            assert bytes(mlc.get(uri)) == b"rows"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
