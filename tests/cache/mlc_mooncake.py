"""A real mooncake_master on loopback (its own HTTP metadata server, ports chosen free) for the
Mooncake tier's tests. Without the package or the binary's libraries the tests skip and say
why; under CI=true they fail with that one line instead."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sdcp_fast.cache.tiers.mooncake import MooncakeConfig
from sdcp_fast.deploy.up import free_port

MiB = 1 << 20


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the Mooncake tier tests need Mooncake Store: {why}", pytrace=False)
    pytest.skip(why)


def master_binary() -> Path:
    try:
        import mooncake.store  # noqa: F401  (the client library loads libibverbs too)
    except ImportError as exc:
        unavailable(f"mooncake-transfer-engine-non-cuda is not importable ({exc}): it is in sdcp-fast[services], "
                    "and scripts/services.sh installs the libibverbs1 it loads")
    import mooncake

    binary = Path(mooncake.__file__).parent / "mooncake_master"
    if not binary.exists():
        unavailable(f"{binary} is missing from the mooncake package")
    if not os.access(binary, os.X_OK):  # wheels may lose the mode bit; the package's own launcher sets it too
        binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


@dataclass
class Master:
    proc: subprocess.Popen[bytes]
    address: str
    metadata: str

    def config(self, **kwargs: object) -> MooncakeConfig:
        """A client that lends 16 MiB and reaches its peers on loopback."""
        settings: dict[str, object] = {"segment_bytes": 16 * MiB, "buffer_bytes": 8 * MiB, "hostname": "127.0.0.1"}
        settings.update(kwargs)
        return MooncakeConfig(self.address, self.metadata, **settings)  # type: ignore[arg-type]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@contextmanager
def running_master(*, lease_ms: int = 200, client_ttl_s: int = 2, host: str = "127.0.0.1",
                   wrap: Sequence[str] = (), ports: tuple[int, int] | None = None) -> Iterator[Master]:
    """``lease_ms``: the master's read lease, during which an object just read cannot be
    removed; short here so deletions are not deferred for long. ``wrap``: what runs the master
    (``ip netns exec NS`` on a simulated host whose address is ``host``). ``ports``: its RPC and
    metadata ports, for a client configured before the master starts (default: free ones)."""
    binary = master_binary()
    rpc, meta = ports or (free_port(), free_port())
    metrics = free_port()
    log = tempfile.TemporaryFile()  # a pipe nobody drains would stall the master's logging
    proc = subprocess.Popen(
        [*wrap, str(binary), f"--rpc_port={rpc}", f"--rpc_address={host}", "--rpc_thread_num=2",
         "--enable_http_metadata_server=true", f"--http_metadata_server_host={host}",
         f"--http_metadata_server_port={meta}", f"--metrics_host={host}", f"--metrics_port={metrics}",
         f"--default_kv_lease_ttl={lease_ms}", f"--client_ttl={client_ttl_s}"],
        stdout=subprocess.DEVNULL, stderr=log)
    master = Master(proc, f"{host}:{rpc}", f"http://{host}:{meta}/metadata")
    try:
        deadline = time.monotonic() + 60
        while not _answers(host, rpc) or not _answers(host, meta):
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                unavailable(f"mooncake_master exited with {proc.returncode}: {_last_line(err)}")
            if time.monotonic() > deadline:
                pytest.fail("mooncake_master did not listen within 60 s")
            time.sleep(0.05)
        yield master
    finally:
        master.kill()
        log.close()


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing on stderr)"
