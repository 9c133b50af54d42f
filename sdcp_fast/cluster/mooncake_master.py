"""The cluster's Mooncake Store (docs/mlc.md, "Mooncake Store"): the ``mooncake_master`` that
one host of the spec runs (its ``mooncake-master`` instance), and what every host's MLC node is
told to lend it and reach it by.

The master places objects in the segments the MLC nodes lend; each object is kept in two of
them, so what a takeover on another host reads (target KV pages, prompt KV,
``committed_tokens``) outlives the host that wrote it while another lender is up. The master
keeps no object itself: losing its host loses the tier (every call answers
``mlc-tier-unreachable`` at once for a while), and the roles fall back on what they can
recompute.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sdcp_fast.cluster.spec import ClusterSpec, Instance

SEGMENT_MIB = 128  # memory each MLC node lends the store
STORE_MIB = 512  # what each MLC node keeps in the store at most
# A read keeps an object from removal this long (the master's default is 10 s, which defers
# every drop of an object just read).
READ_LEASE_MS = 1000
# How long a starting host waits for the master before its MLC node starts without the store.
MASTER_WAIT_S = 30.0


def binary() -> Path:
    """The ``mooncake_master`` that ``mooncake-transfer-engine-non-cuda`` ships, made
    executable where the wheel lost its mode bit (FileNotFoundError says what to install)."""
    try:
        import mooncake
    except ImportError as exc:
        raise FileNotFoundError(f"mooncake_master: the mooncake package is not importable ({exc}); it is in "
                                "sdcp-fast[services], and scripts/services.sh installs the libibverbs1 it loads") \
            from None
    path = Path(mooncake.__file__).parent / "mooncake_master"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the mooncake package")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def master_argv(spec: ClusterSpec, me: Instance) -> list[str]:
    """The master's command on its host: RPC, metadata and metrics on the host's address. A
    client (an MLC node) silent for ``lease_ttl_s`` is dropped with its segment, as the
    registry drops a dead host's instances."""
    return [str(binary()), f"--rpc_address={me.address}", f"--rpc_port={me.port}", "--rpc_thread_num=2",
            "--enable_http_metadata_server=true", f"--http_metadata_server_host={me.address}",
            f"--http_metadata_server_port={spec.ports['mooncake-metadata']}",
            f"--metrics_host={me.address}", f"--metrics_port={spec.ports['mooncake-metrics']}",
            f"--default_kv_lease_ttl={READ_LEASE_MS}", f"--client_ttl={spec.lease_ttl_s}"]


def mlc_args(spec: ClusterSpec, me: Instance) -> list[str]:
    """What ``sdcp-fast mlc`` on ``me``'s host adds to use the store: none without a master. A
    node that starts while the master's host is down serves without the store and attaches when
    the master answers (``--mooncake-attach-later``), so that host's roles start all the same."""
    master = spec.mooncake_master()
    if master is None:
        return []
    return ["--mooncake-master", master.uri,
            "--mooncake-metadata", f"http://{master.address}:{spec.ports['mooncake-metadata']}/metadata",
            "--mooncake-hostname", me.address, "--mooncake-segment-mib", str(SEGMENT_MIB),
            "--mooncake-mib", str(STORE_MIB), "--mooncake-attach-later"]
