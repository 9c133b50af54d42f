"""`sdcp-fast mlc` as a process: mTLS on loopback, objects and commit logs, clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from mlc_certs import make_certs
from mlc_redis import free_port

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.client import RemoteMLC, client_ssl
from sdcp_fast.commitlog.http import HttpCommitLog
from sdcp_fast.protocol.commitlog import FenceRecord


def test_serves_over_mutual_tls_and_stops_on_sigterm(tmp_path):
    certs = make_certs(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdcp_fast", "mlc", "--port", str(port), "--root", str(tmp_path / "root"),
         "--host-mib", "4", "--disk-mib", "8", "--cert", certs["server_cert"], "--key", certs["server_key"],
         "--ca", certs["ca"]],
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
        ctx = client_ssl(certs["ca"], certs["client_cert"], certs["client_key"])
        uri = object_uri(bytes(16), b"s" * 16, "q_rows", 1)
        with RemoteMLC(f"https://127.0.0.1:{port}", ssl=ctx) as mlc:
            mlc.put(uri, b"rows", lease_ttl=30)
            assert bytes(mlc.get(uri)) == b"rows"
        router = client_ssl(certs["ca"], certs["router_cert"], certs["router_key"])
        log = HttpCommitLog.on_server(f"https://127.0.0.1:{port}", object_uri(bytes(16), b"s" * 16, "commit_log"),
                                      ssl=router)
        assert log.append(FenceRecord(1), '"0"') == '"1"'
        log.close()
        assert (tmp_path / "root" / "logs").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert f"serving https://127.0.0.1:{port}" in out and "client certificates required" in out
