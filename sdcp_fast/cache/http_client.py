"""Clients of an ``sdcp-fast mlc`` server: the MLC API over the project's transport.

:class:`AsyncMLC` sends each call on a :class:`~sdcp_fast.transport.base.Transport`: by
default HTTP/2 with mutual TLS (one connection, a stream per call, shared with whatever
else uses the same transport), or HTTP/1.1 for a ``--http1`` server; the roles reach it
through :class:`sdcp_fast.store.RemoteStore`, which adds the server's commit logs
(:mod:`sdcp_fast.commitlog.http`) on the same transport. :class:`RemoteMLC` is the same
client for synchronous callers (the MLC bench, tests): it runs an :class:`AsyncMLC` on an
event loop of its own in a background thread, so any number of threads share its one
connection.

Failures keep the store's contract: a problem the server answers is raised as the cache
error of its type (:mod:`sdcp_fast.cache.failures`) or the generic problem of its status; no
answer at all (refused, reset, timed out) is a :class:`MLCUnreachable`, a ConnectionError.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sdcp_fast.cache import failures
from sdcp_fast.cache.index import Head, Stored
from sdcp_fast.cache.uri import SCHEME, check_key
from sdcp_fast.protocol.cbor import decode, deterministic_cbor
from sdcp_fast.protocol.problems import Forbidden, SdcpProblem
from sdcp_fast.transport import http_transport
from sdcp_fast.transport.base import Response, Transport
from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.loop import LoopThread
from sdcp_fast.transport.problem import problem_body
from sdcp_fast.transport.problem import problem_of as _problem_of

T = TypeVar("T")

_OURS: dict[str, type[SdcpProblem]] = {
    cls.suffix: cls for cls in (failures.ObjectUnavailable, failures.ObjectLeased, failures.UnknownLease,
                                failures.CacheFull, failures.BadRange)
}

_BODILESS: dict[int, type[SdcpProblem]] = {404: failures.ObjectUnavailable, 403: Forbidden}
MAX_OBJECT = 1 << 30  # the server's limit on an object; a response up to it is accepted
INLINE_BYTES = 256 << 10  # larger bodies are encoded and decoded off the event loop
# 256 KiB DATA frames, as the MLC server asks (mlc_server/server.py MAX_FRAME says why).
MAX_FRAME = 256 << 10


class MLCUnreachable(ConnectionError):
    """No answer from the MLC server (connection refused, reset, TLS failure, timeout)."""


def mlc_transport(ssl: ssl.SSLContext | None = None, *, http1: bool = False,
                  timeout: float | None = 30.0) -> Transport:
    """A transport for the MLC (:func:`~sdcp_fast.transport.http_transport`): responses up to
    an object's size, in the DATA frames the server asks for."""
    return http_transport(ssl, http1=http1, timeout=timeout, max_body=MAX_OBJECT, max_frame=MAX_FRAME)


def problem_of(response: Response) -> SdcpProblem:
    """The cache error a problem response stands for; a HEAD answer has no body, so its
    status says what it is."""
    return _problem_of(response, _OURS, _BODILESS if problem_body(response) is None else None)


def _path(prefix: str, uri: str) -> str:
    check_key(uri)
    if not uri.startswith(SCHEME):
        raise ValueError(f"remote MLC objects are mlc:// URIs: {uri!r}")
    return prefix + uri[len(SCHEME):]


def _ms(seconds: float | None) -> int:
    if seconds is None or seconds <= 0:
        raise ValueError("lease ttl must be positive")
    return max(1, round(seconds * 1000))


def _check_base(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected http(s)://host:port, got {base_url!r}")
    return base_url.rstrip("/") + "/"


class AsyncMLC:
    """The MLC API of :class:`sdcp_fast.cache.MLC` as coroutines, served by a remote
    ``sdcp-fast mlc`` and reached through ``transport`` (see :func:`mlc_transport`)."""

    def __init__(self, base_url: str, transport: Transport, *, timeout: float | None = None) -> None:
        self.base_url = _check_base(base_url)
        self.transport = transport
        self.timeout = timeout

    async def _call(self, method: str, path: str, body: Any = b"", headers: Mapping[str, str] | None = None,
                    query: Mapping[str, str] | None = None) -> Response:
        try:
            response = await self.transport.request(self.base_url, method, path, body=body, query=query,
                                                    headers=headers, timeout=self.timeout)
        except TransportError as exc:
            raise MLCUnreachable(str(exc)) from exc
        if response.status >= 400:
            raise problem_of(response)
        return response

    async def put(self, uri: str, data: Any, lease_ttl: float | None = None, *,
                  meta: dict[str, Any] | None = None) -> Stored:
        from sdcp_fast.cache.tiers.tier import as_bytes_view

        view = as_bytes_view(data)
        if hasattr(data, "untyped_storage"):
            meta = {"dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape), **(meta or {})}
        query = None
        if meta:
            doc = {"meta": meta, **({"lease_ms": _ms(lease_ttl)} if lease_ttl else {})}

            def encode() -> bytes:
                return deterministic_cbor({"data": bytes(view), **doc})

            # A large tensor (q rows) is copied and encoded on a worker thread, not on the
            # caller's event loop (which is serving the role's requests meanwhile).
            body: Any = encode() if view.nbytes <= INLINE_BYTES else \
                await asyncio.get_running_loop().run_in_executor(None, encode)
            headers = {"content-type": "application/cbor"}
        else:
            body, headers = view, {"content-type": "application/octet-stream"}
            query = {"lease_ms": str(_ms(lease_ttl))} if lease_ttl else None
        out = await self._call("PUT", _path("objects/", uri), body, headers, query)
        doc = decode(out.body)
        return Stored(doc["etag"], doc["tier"], doc.get("lease"))

    async def get(self, uri: str) -> memoryview:
        return memoryview((await self._call("GET", _path("objects/", uri))).body)

    async def get_doc(self, uri: str) -> dict[str, Any]:
        """The object's CBOR form: {data, etag, meta}."""
        out = await self._call("GET", _path("objects/", uri), headers={"accept": "application/cbor"})
        if len(out.body) <= INLINE_BYTES:
            doc: dict[str, Any] = decode(out.body)
        else:
            doc = await asyncio.get_running_loop().run_in_executor(None, decode, out.body)
        return doc

    async def get_tensor(self, uri: str, device: str | None = None) -> Any:
        """The object as a tensor, with the dtype/shape its writer gave (flat uint8 otherwise)."""
        return _tensor(uri, await self.get_doc(uri), device)

    async def get_into(self, uri: str, out: Any) -> int:
        return _copy_into(uri, await self.get(uri), out)

    async def get_range(self, uri: str, start: int, stop: int | None = None) -> memoryview:
        if stop is not None and stop <= start:
            if stop < start:
                raise failures.BadRange(f"[{start}, {stop}) is not a range")
            return memoryview(b"")
        spec = f"bytes={start}-" + ("" if stop is None else str(stop - 1))
        return memoryview((await self._call("GET", _path("objects/", uri), headers={"range": spec})).body)

    async def head(self, uri: str) -> Head:
        h = (await self._call("HEAD", _path("objects/", uri))).headers
        size = h.get("mlc-size") or h["content-length"]
        return Head(int(size), h["etag"], h.get("mlc-tier", ""), h.get("mlc-leased") == "1", {})

    async def contains(self, uri: str) -> bool:
        try:
            await self.head(uri)
        except failures.ObjectUnavailable:
            return False
        return True

    async def delete(self, uri: str) -> None:
        await self._call("DELETE", _path("objects/", uri))

    async def lease(self, uri: str, ttl: float) -> str:
        out = await self._call("POST", "leases", deterministic_cbor({"uri": uri, "ttl_ms": _ms(ttl)}),
                               {"content-type": "application/cbor"})
        lease: str = decode(out.body)["lease"]
        return lease

    async def renew(self, lease_id: str, ttl: float) -> None:
        await self._call("PUT", "leases/" + lease_id, deterministic_cbor({"ttl_ms": _ms(ttl)}),
                         {"content-type": "application/cbor"})

    async def release(self, lease_id: str, *, drop: bool = False) -> None:
        await self._call("DELETE", "leases/" + lease_id, query={"drop": "1"} if drop else None)

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads((await self._call("GET", "stats")).body)
        return out

    async def close(self) -> None:
        await self.transport.close()


def _tensor(uri: str, doc: dict[str, Any], device: str | None) -> Any:
    import torch

    meta = doc.get("meta") or {}
    dtype = getattr(torch, str(meta.get("dtype", "uint8")), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{uri} has no usable dtype in its metadata: {meta.get('dtype')!r}")
    data = bytearray(doc["data"])
    flat = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    out = flat.view(dtype)
    out = out.reshape(meta["shape"]) if "shape" in meta else out
    return out.to(device) if device is not None else out


def _copy_into(uri: str, data: memoryview, out: Any) -> int:
    view = memoryview(out).cast("B")
    if data.nbytes > view.nbytes:
        raise failures.BadRange(f"{uri} has {data.nbytes} bytes; the buffer holds {view.nbytes}")
    view[: data.nbytes] = data
    return data.nbytes


class RemoteMLC:
    """The MLC API of :class:`sdcp_fast.cache.MLC`, blocking, served by a remote ``sdcp-fast
    mlc``: HTTP/2 by default (``ssl``: a :func:`~sdcp_fast.transport.tls.client_context`; none: h2c
    on loopback),
    HTTP/1.1 with ``http1`` (a ``--http1`` server)."""

    def __init__(self, base_url: str, *, ssl: ssl.SSLContext | None = None, timeout: float = 30.0,
                 http1: bool = False) -> None:
        _check_base(base_url)
        self.base_url = base_url
        self._runner = LoopThread("mlc-client")
        self._prefetched: dict[str, bytes] = {}
        self._lock = threading.Lock()

        async def make() -> AsyncMLC:
            return AsyncMLC(base_url, mlc_transport(ssl, http1=http1, timeout=timeout))

        self.aio = self._runner.run(make())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def put(self, uri: str, data: Any, lease_ttl: float | None = None, *,
            meta: dict[str, Any] | None = None) -> Stored:
        stored = self._run(self.aio.put(uri, data, lease_ttl, meta=meta))
        with self._lock:
            self._prefetched.pop(uri, None)
        return stored

    def get(self, uri: str) -> memoryview:
        with self._lock:
            early = self._prefetched.pop(uri, None)
        if early is not None:
            return memoryview(early)
        return self._run(self.aio.get(uri))

    def get_tensor(self, uri: str, device: str | None = None) -> Any:
        """The object as a tensor, with the dtype/shape its writer gave (flat uint8 otherwise)."""
        return _tensor(uri, self._run(self.aio.get_doc(uri)), device)

    def get_into(self, uri: str, out: Any) -> int:
        return _copy_into(uri, self.get(uri), out)

    def get_range(self, uri: str, start: int, stop: int | None = None) -> memoryview:
        return self._run(self.aio.get_range(uri, start, stop))

    def head(self, uri: str) -> Head:
        return self._run(self.aio.head(uri))

    def contains(self, uri: str) -> bool:
        return self._run(self.aio.contains(uri))

    def delete(self, uri: str) -> None:
        self._run(self.aio.delete(uri))

    def lease(self, uri: str, ttl: float) -> str:
        return self._run(self.aio.lease(uri, ttl))

    def renew(self, lease_id: str, ttl: float) -> None:
        self._run(self.aio.renew(lease_id, ttl))

    def release(self, lease_id: str, *, drop: bool = False) -> None:
        self._run(self.aio.release(lease_id, drop=drop))

    def prefetch(self, uris: list[str]) -> Future[list[bool]]:
        """Fetch objects in the background (concurrent streams); the next ``get`` of each is
        served locally."""
        wanted = list(uris)

        async def one(uri: str) -> bool:
            try:
                data = await self.aio.get(uri)
            except failures.ObjectUnavailable:
                return False
            with self._lock:
                self._prefetched[uri] = bytes(data)
            return True

        async def run() -> list[bool]:
            return list(await asyncio.gather(*(one(uri) for uri in wanted)))

        return self._runner.submit(run())

    def stats(self) -> dict[str, Any]:
        return self._run(self.aio.stats())

    def close(self) -> None:
        if self._runner.loop.is_closed():
            return
        try:
            self._run(self.aio.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> RemoteMLC:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
