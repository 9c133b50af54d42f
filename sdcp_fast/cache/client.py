"""Synchronous client of an ``sdcp-fast mlc`` server: the MLC API over HTTP(S) with mTLS,
for drafters and verifiers on other machines. One keep-alive connection per thread.
The server's commit logs are reached with ``sdcp_fast.commitlog.http.HttpCommitLog``."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlsplit

import cbor2

from sdcp_fast.cache import errors
from sdcp_fast.cache.store import Head, Stored
from sdcp_fast.cache.uri import SCHEME, check_key
from sdcp_fast.protocol.problems import Forbidden, SdcpProblem, problem_from_response, type_suffix

_OURS: dict[str, type[SdcpProblem]] = {
    cls.suffix: cls for cls in (errors.ObjectUnavailable, errors.ObjectLeased, errors.UnknownLease,
                                errors.CacheFull, errors.BadRange)
}

_BODILESS: dict[int, type[SdcpProblem]] = {404: errors.ObjectUnavailable, 403: Forbidden}


def client_ssl(ca: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """Client context: trust ``ca`` and present ``cert``/``key`` (mTLS)."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


class _Http:
    def __init__(self, base: str, ssl_ctx: ssl.SSLContext | None, timeout: float) -> None:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected http(s)://host:port, got {base!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.root = parts.path.rstrip("/")
        self.ssl = ssl_ctx
        self.timeout = timeout
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self.ssl)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request(method, self.root + path, body=body, headers=headers or {})
                resp = conn.getresponse()
                data = resp.read()
                break
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        if resp.status >= 400:
            raise _problem(resp.status, hdrs, data)
        return resp.status, hdrs, data

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _problem(status: int, headers: dict[str, str], body: bytes) -> SdcpProblem:
    doc = None
    if headers.get("content-type", "").startswith("application/problem+json"):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
    generic = problem_from_response(status, doc if isinstance(doc, dict) else None)
    cls = _OURS.get(type_suffix(generic.type_uri))
    if cls is None and doc is None:  # a HEAD answer has no body: its status says what it is
        cls = _BODILESS.get(status)
    if cls is None:
        return generic
    return cls(generic.detail if generic.detail != generic.title else "", extra=generic.extra)


def _path(prefix: str, uri: str) -> str:
    check_key(uri)
    if not uri.startswith(SCHEME):
        raise ValueError(f"remote MLC objects are mlc:// URIs: {uri!r}")
    return prefix + quote(uri[len(SCHEME):], safe="/")


class RemoteMLC:
    """The MLC API of :class:`sdcp_fast.cache.MLC`, served by a remote ``sdcp-fast mlc``."""

    def __init__(self, base_url: str, *, ssl: ssl.SSLContext | None = None, timeout: float = 30.0) -> None:
        self._http = _Http(base_url, ssl, timeout)
        self.base_url = base_url
        self._prefetched: dict[str, bytes] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def put(self, uri: str, data: Any, lease_ttl: float | None = None, *,
            meta: dict[str, Any] | None = None) -> Stored:
        from sdcp_fast.cache.tiers.base import as_bytes_view

        view = as_bytes_view(data)
        if hasattr(data, "untyped_storage"):
            meta = {"dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape), **(meta or {})}
        if meta:
            body: Any = cbor2.dumps({"data": bytes(view), "meta": meta,
                                     **({"lease_ms": _ms(lease_ttl)} if lease_ttl else {})})
            headers = {"Content-Type": "application/cbor"}
            path = _path("/objects/", uri)
        else:
            body, headers = view, {"Content-Type": "application/octet-stream"}
            path = _path("/objects/", uri) + (f"?lease_ms={_ms(lease_ttl)}" if lease_ttl else "")
        _, _, out = self._http.request("PUT", path, body, headers)
        doc = cbor2.loads(out)
        with self._lock:
            self._prefetched.pop(uri, None)
        return Stored(doc["etag"], doc["tier"], doc.get("lease"))

    def get(self, uri: str) -> memoryview:
        with self._lock:
            early = self._prefetched.pop(uri, None)
        if early is not None:
            return memoryview(early)
        return memoryview(self._http.request("GET", _path("/objects/", uri))[2])

    def get_tensor(self, uri: str, device: str | None = None) -> Any:
        """The object as a tensor, with the dtype/shape its writer gave (flat uint8 otherwise)."""
        import torch

        _, _, body = self._http.request("GET", _path("/objects/", uri), headers={"Accept": "application/cbor"})
        doc = cbor2.loads(body)
        meta = doc.get("meta") or {}
        dtype = getattr(torch, str(meta.get("dtype", "uint8")), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{uri} has no usable dtype in its metadata: {meta.get('dtype')!r}")
        data = bytearray(doc["data"])
        flat = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        out = flat.view(dtype)
        out = out.reshape(meta["shape"]) if "shape" in meta else out
        return out.to(device) if device is not None else out

    def get_into(self, uri: str, out: Any) -> int:
        data = self.get(uri)
        view = memoryview(out).cast("B")
        if data.nbytes > view.nbytes:
            raise errors.BadRange(f"{uri} has {data.nbytes} bytes; the buffer holds {view.nbytes}")
        view[: data.nbytes] = data
        return data.nbytes

    def get_range(self, uri: str, start: int, stop: int | None = None) -> memoryview:
        if stop is not None and stop <= start:
            if stop < start:
                raise errors.BadRange(f"[{start}, {stop}) is not a range")
            return memoryview(b"")
        spec = f"bytes={start}-" + ("" if stop is None else str(stop - 1))
        status, _, data = self._http.request("GET", _path("/objects/", uri), headers={"Range": spec})
        return memoryview(data)

    def head(self, uri: str) -> Head:
        _, h, _ = self._http.request("HEAD", _path("/objects/", uri))
        return Head(int(h["content-length"]), h["etag"], h.get("mlc-tier", ""), h.get("mlc-leased") == "1", {})

    def contains(self, uri: str) -> bool:
        try:
            self.head(uri)
        except errors.ObjectUnavailable:
            return False
        return True

    def delete(self, uri: str) -> None:
        self._http.request("DELETE", _path("/objects/", uri))

    def lease(self, uri: str, ttl: float) -> str:
        _, _, out = self._http.request("POST", "/leases", cbor2.dumps({"uri": uri, "ttl_ms": _ms(ttl)}),
                                       {"Content-Type": "application/cbor"})
        lease: str = cbor2.loads(out)["lease"]
        return lease

    def renew(self, lease_id: str, ttl: float) -> None:
        self._http.request("PUT", "/leases/" + quote(lease_id, safe=""), cbor2.dumps({"ttl_ms": _ms(ttl)}),
                           {"Content-Type": "application/cbor"})

    def release(self, lease_id: str) -> None:
        self._http.request("DELETE", "/leases/" + quote(lease_id, safe=""))

    def prefetch(self, uris: list[str]) -> Future[list[bool]]:
        """Fetch objects in the background; the next ``get`` of each is served locally."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(2, thread_name_prefix="mlc-remote-prefetch")
        wanted = list(uris)

        def run() -> list[bool]:
            out = []
            for uri in wanted:
                try:
                    data = self._http.request("GET", _path("/objects/", uri))[2]
                except errors.ObjectUnavailable:
                    out.append(False)
                    continue
                with self._lock:
                    self._prefetched[uri] = data
                out.append(True)
            return out

        return self._pool.submit(run)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self._http.request("GET", "/stats")[2])
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._http.close()

    def __enter__(self) -> RemoteMLC:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ms(seconds: float | None) -> int:
    if seconds is None or seconds <= 0:
        raise ValueError("lease ttl must be positive")
    return max(1, round(seconds * 1000))
