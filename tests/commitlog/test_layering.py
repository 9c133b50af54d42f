"""The cache and the commit log do not import each other; only the store (``sdcp_fast.store``)
composes them (tests/store/test_local_store.py: the embedded default)."""

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
    code = ("import sys, sdcp_fast.cache, sdcp_fast.cache.http_client, sdcp_fast.cache.policy; "
            "assert not [m for m in sys.modules if m.startswith('sdcp_fast.commitlog')]; "
            "import sdcp_fast.commitlog.http, sdcp_fast.commitlog.directory, sdcp_fast.commitlog.etcd")
    subprocess.run([sys.executable, "-c", code], check=True)
    code = ("import sys, sdcp_fast.commitlog, sdcp_fast.commitlog.http, sdcp_fast.commitlog.directory; "
            "assert not [m for m in sys.modules if m.startswith('sdcp_fast.cache')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_only_the_store_composes_the_cache_and_the_commit_logs():
    """Of the lower layers, only sdcp_fast.store imports both; the roles and the deployments
    reach objects and logs through its interface."""
    for package in ("protocol", "kernels", "model", "transport"):
        found = _imports(package)
        assert not {m for m in found if m.startswith(("sdcp_fast.cache", "sdcp_fast.commitlog"))}, package
    store = _imports("store")
    assert any(m.startswith("sdcp_fast.cache") for m in store) and any(m.startswith("sdcp_fast.commitlog") for m in store)
