"""The cache and the commit log do not import each other; ``sdcp_fast.embedded`` composes
them into the embedded default (issue 9, layering)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import sdcp_fast

PACKAGE = pathlib.Path(sdcp_fast.__file__).parent


def _imports(package: str) -> set[str]:
    found: set[str] = set()
    for path in (PACKAGE / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


def test_cache_and_commitlog_do_not_import_each_other():
    assert not {m for m in _imports("cache") if m.startswith("sdcp_fast.commitlog")}
    assert not {m for m in _imports("commitlog") if m.startswith("sdcp_fast.cache")}
    code = ("import sys, sdcp_fast.cache, sdcp_fast.cache.client, sdcp_fast.cache.policy; "
            "assert not [m for m in sys.modules if m.startswith('sdcp_fast.commitlog')]; "
            "import sdcp_fast.commitlog.http, sdcp_fast.commitlog.directory, sdcp_fast.commitlog.etcd")
    subprocess.run([sys.executable, "-c", code], check=True)
    code = ("import sys, sdcp_fast.commitlog, sdcp_fast.commitlog.http, sdcp_fast.commitlog.directory; "
            "assert not [m for m in sys.modules if m.startswith('sdcp_fast.cache')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_embedded_store_is_the_cache_plus_its_logs(tmp_path):
    from sdcp_fast.cache import object_uri
    from sdcp_fast.commitlog import open_commit_log
    from sdcp_fast.embedded import embedded
    from sdcp_fast.protocol.commitlog import FenceRecord

    ref = object_uri(bytes(16), bytes(16), "commit_log")
    with embedded(str(tmp_path), host_bytes=1 << 16, disk_bytes=1 << 16, max_open_logs=1, max_objects=4) as store:
        q = object_uri(bytes(16), bytes(16), "q_rows", 1)
        store.put(q, b"rows")
        assert bytes(store.get(q)) == b"rows" and store.stats()["index"]["max_objects"] == 4
        assert store.commit_log(ref).append(FenceRecord(1), '"0"') == '"1"'
        assert open_commit_log(ref, mlc=store).read().records == [FenceRecord(1)]
        other = object_uri(bytes(16), b"\x01" * 16, "commit_log")
        store.commit_log(other).append(FenceRecord(1), None)
        assert store.logs.open_count == 1
    assert (tmp_path / "logs").is_dir()
    assert open_commit_log(ref, root=str(tmp_path)).read().records == [FenceRecord(1)], "the file outlives the store"
