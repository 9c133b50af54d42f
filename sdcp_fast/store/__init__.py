"""The store the roles use: objects, leases and commit logs behind one typed interface.

``interface`` holds :class:`Store` and :class:`Log` (typing.Protocol); ``local_store`` the
in-process implementation (:func:`embedded` builds the default one); ``remote_store`` the
client of an ``sdcp-fast mlc`` server (whose code is :mod:`sdcp_fast.mlc_server`); ``nodes`` a
cluster's MLC nodes, one per host, as one store; ``logs`` the
blocking commit-log backends as awaitable logs. This package is the one place that composes the cache
(:mod:`sdcp_fast.cache`) with the commit logs (:mod:`sdcp_fast.commitlog`). See docs/mlc.md.
"""

from typing import TYPE_CHECKING

from sdcp_fast.store.interface import Log, LogAppend, Store
from sdcp_fast.store.local_store import LocalStore, embedded
from sdcp_fast.store.nodes import NodeStore
from sdcp_fast.store.remote_store import RemoteStore

__all__ = ["LocalStore", "Log", "LogAppend", "NodeStore", "RemoteStore", "Store", "embedded"]

if TYPE_CHECKING:  # both implementations satisfy the interface: mypy checks it here

    def _implements(local: LocalStore, remote: RemoteStore, nodes: NodeStore) -> tuple[Store, Store, Store]:
        return local, remote, nodes
