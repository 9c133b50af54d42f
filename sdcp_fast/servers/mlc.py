"""HTTP API of the MLC (a KVSP-like object API) and of its commit logs.

Objects (``<name>`` is an ``mlc://<scope>/<session>/<kind>[/<round>]`` URI without its scheme):
  PUT    /objects/<name>[?lease_ms=N]   raw body, or application/cbor {data, ? lease_ms, ? meta}
  GET    /objects/<name>                raw bytes; ``Range: bytes=a-b`` gives 206;
                                        ``Accept: application/cbor`` gives {data, etag, meta}
  HEAD   /objects/<name>                Content-Length, ETag, MLC-Tier, MLC-Leased
  DELETE /objects/<name>
Leases: POST /leases {uri, ttl_ms} -> {lease}; PUT /leases/<id> {ttl_ms}; DELETE /leases/<id>
Commit logs: GET /logs/<name>?from=n (application/cbor-seq of records, ETag of the log; 404
  for a log never appended to); POST /logs/<name> with one CBOR record and If-Match (412 on
  a stale tag, 409 sdcp-stale-epoch when fenced, 413 over the record limit).
Metrics: GET /stats (JSON), GET /metrics (Prometheus text).

Errors are RFC 9457 problem details, never tracebacks. With client certificates (mTLS) every
request is authorized by :mod:`sdcp_fast.cache.policy` (docs/security.md). Bodies are read
in chunks against their limit (a declared Content-Length over it is refused unread) and
released as soon as the request ends, also when the client goes away mid-body; large
bodies are encoded, decoded and copied on worker threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import cbor2
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sdcp_fast.cache import policy
from sdcp_fast.cache.errors import BadRange
from sdcp_fast.cache.store import MAX_LEASE_TTL, MLC
from sdcp_fast.cache.uri import SCHEME, ObjectName, served_name
from sdcp_fast.commitlog.base import RecordTooLarge, UnknownLog
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.file import MAX_RECORD
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import decode_record, encode_record
from sdcp_fast.protocol.identity import Peer, peer_from_uris
from sdcp_fast.protocol.problems import PROBLEM_MEDIA_TYPE, BadRequest, SdcpProblem

MLC_KEY = web.AppKey("mlc", MLC)
LOGS_KEY = web.AppKey("logs", LogDirectory)
CBOR = "application/cbor"
CBOR_SEQ = "application/cbor-seq"
OCTETS = "application/octet-stream"
# Above this size, bytes are copied, encoded and decoded on a worker thread, not on the loop.
INLINE_BYTES = 256 << 10
MAX_BODY = 1 << 30  # an object upload
MAX_SMALL_BODY = 4 << 10  # a lease request
MAX_LEASE_MS = int(MAX_LEASE_TTL * 1000)
# Object bodies held at once, over all uploads in flight: concurrent uploads cannot hold
# more memory than this however many clients send them.
MAX_INFLIGHT = 2 << 30

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InternalError(SdcpProblem):
    suffix = "mlc-internal"
    status = 500
    title = "MLC internal error"


class BodyTooLarge(SdcpProblem):
    suffix = "mlc-too-large"
    status = 413
    title = "Request body over the server's limit"


class Busy(SdcpProblem):
    suffix = "mlc-busy"
    status = 503
    title = "Too many upload bytes in flight; retry later"


class UploadBudget:
    """Bytes of object bodies held by uploads in flight (the event loop is the only user)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> None:
        if self.used + n > self.limit:
            raise Busy(f"{self.used} of {self.limit} upload bytes are in flight", extra={"limit": self.limit})
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n


BUDGET_KEY = web.AppKey("upload_budget", UploadBudget)


class Incomplete(SdcpProblem):
    suffix = "mlc-incomplete-body"
    status = 400
    title = "The request body ended early"


def problem_response(problem: SdcpProblem) -> web.Response:
    return web.Response(status=problem.status, body=problem.render(), content_type=PROBLEM_MEDIA_TYPE)


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SdcpProblem as p:
        resp = problem_response(p)
    except ValueError as exc:
        resp = problem_response(BadRequest(str(exc)))
    except ConnectionError as exc:
        # The client went away mid-request: nobody reads an answer, and it is no server fault.
        log.debug("MLC client left during %s %s: %s", request.method, request.path, exc)
        resp = problem_response(Incomplete(str(exc)))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own refusals (no such route, wrong method, ...) as problem details too.
        body = json.dumps({"type": "about:blank", "title": exc.reason, "status": exc.status}).encode()
        resp = web.Response(status=exc.status, body=body, content_type=PROBLEM_MEDIA_TYPE,
                            headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"})
    except Exception:
        log.exception("MLC request failed: %s %s", request.method, request.path)
        resp = problem_response(InternalError())
    if not request.content.is_eof():
        # A refused body is neither read nor drained (aiohttp would linger up to 10 s
        # reading it): answer, then close the connection.
        resp.force_close()
        await resp.prepare(request)
        await resp.write_eof()
        request.protocol.force_close()
    return resp


def request_peer(request: web.Request) -> Peer | None:
    """The peer of a client certificate's URI SANs; None when TLS authenticated nobody."""
    ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
    cert = ssl_obj.getpeercert() if ssl_obj is not None else None
    if not cert:
        return None
    return peer_from_uris(value for kind, value in cert.get("subjectAltName", ()) if kind == "URI")


async def read_body(request: web.Request, limit: int, budget: UploadBudget | None = None) -> bytearray:
    """The body, at most ``limit`` bytes; a declared length over it is refused unread. Bytes
    are taken from ``budget`` as they arrive (the caller gives ``len(body)`` back when done).
    On any failure (client gone, over a limit) the bytes read so far are freed and given back
    at once rather than left to whatever keeps the failed frame alive."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"body of {declared} bytes; this route takes at most {limit}", extra={"limit": limit})
    buf = bytearray()
    try:
        async for chunk in request.content.iter_any():
            if len(buf) + len(chunk) > limit:
                raise BodyTooLarge(f"body over {limit} bytes", extra={"limit": limit})
            if budget is not None:
                budget.take(len(chunk))
            buf += chunk
    except BaseException:
        if budget is not None:
            budget.give(len(buf))
        del buf[:]
        raise
    if declared is not None and len(buf) != declared:
        raise Incomplete(f"{len(buf)} of {declared} bytes")
    return buf


def _release(buf: bytearray) -> None:
    try:
        del buf[:]
    except BufferError:
        pass  # still viewed (by a stored object or an exception): its owner frees it


async def _offload(size: int, fn: Callable[[], Any]) -> Any:
    if size <= INLINE_BYTES:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(None, fn)


async def _store(mlc: MLC, fn: Callable[[], Any], size: int = 0) -> Any:
    """Run a store call: inline when it is small and the store's lock is free, else on a
    worker thread, so the event loop never waits behind a large copy holding the lock."""
    if size <= INLINE_BYTES:
        with mlc.held_if_free() as free:
            if free:
                return fn()
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _name(request: web.Request, *, log: bool = False) -> tuple[str, ObjectName]:
    uri = SCHEME + request.match_info["name"]
    return uri, served_name(uri, log=log)


def _ttl(value: Any, field: str) -> float:
    """A lease TTL in milliseconds on the wire: a uint in [1, MAX_LEASE_MS]; seconds back."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LEASE_MS:
        raise BadRequest(f"{field} must be an integer number of milliseconds in [1, {MAX_LEASE_MS}]",
                         extra={"max_ms": MAX_LEASE_MS})
    return value / 1000.0


def _query_uint(request: web.Request, field: str, digits: int) -> int | None:
    text = request.query.get(field)
    if text is None:
        return None
    if not re.fullmatch(rf"\d{{1,{digits}}}", text):
        raise BadRequest(f"{field} must be a decimal uint of at most {digits} digits")
    return int(text)


async def put_object(request: web.Request) -> web.Response:
    mlc = request.app[MLC_KEY]
    uri, name = _name(request)
    peer = request_peer(request)
    check = policy.may_put(peer, name)  # refused before the body is read
    lease_ms: Any = _query_uint(request, "lease_ms", 10)
    budget = request.app[BUDGET_KEY]
    body = await read_body(request, MAX_BODY, budget)
    try:
        meta = None
        data: Any = body
        if request.content_type == CBOR:
            # Untrusted input: the strict decoder only raises BadRequest.
            msg = await _offload(len(body), lambda: cbor.decode(body))
            if not isinstance(msg, dict) or not isinstance(msg.get("data"), bytes):
                raise BadRequest("CBOR object body is {data: bstr, ? lease_ms: uint, ? meta: map}")
            data, meta = msg["data"], msg.get("meta")
            lease_ms = msg.get("lease_ms", lease_ms)
            if meta is not None and not (isinstance(meta, dict) and all(isinstance(k, str) for k in meta)):
                raise BadRequest("meta must be a map with text keys")
        ttl = None if lease_ms is None else _ttl(lease_ms, "lease_ms")
        stored = await _store(mlc, lambda: mlc.put(uri, data, ttl, meta=meta, owner=policy.principal(peer),
                                                   check=check), len(data))
    finally:
        budget.give(len(body))
        _release(body)
    out = {"etag": stored.etag, "tier": stored.tier}
    if stored.lease is not None:
        out["lease"] = stored.lease
    return web.Response(status=201, body=cbor2.dumps(out), content_type=CBOR, headers={"ETag": stored.etag})


_RANGE = re.compile(r"^bytes=(\d{0,19})-(\d{0,19})$")


def _span(spec: str) -> Callable[[int], tuple[int, int]]:
    m = _RANGE.match(spec.strip())
    if m is None or m.groups() == ("", ""):
        raise BadRange(f"unsupported Range {spec!r}")
    first, last = m.groups()

    def span(size: int) -> tuple[int, int]:
        if first == "":
            start, stop = max(0, size - int(last)), size
        else:
            start = int(first)
            stop = size if last == "" else min(int(last) + 1, size)
        if start >= size or stop < start:
            raise BadRange(f"{spec} outside {size} bytes", extra={"size": size})
        return start, stop

    return span


async def get_object(request: web.Request) -> web.Response:
    mlc = request.app[MLC_KEY]
    uri, name = _name(request)
    check = policy.may_read(request_peer(request), name)
    spec = request.headers.get("Range")
    span = None if spec is None else _span(spec)
    hint = (await _store(mlc, lambda: mlc.head(uri))).size  # where to copy; the answer's head comes with the bytes
    # One step: the entity tag sent is the one of the bytes sent, whatever puts race with us.
    head, view = await _store(mlc, lambda: mlc.read(uri, span, check=check), hint)
    headers = {"ETag": head.etag, "Accept-Ranges": "bytes", "MLC-Tier": head.tier}
    if span is not None:
        start, stop = span(head.size)
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{head.size}"
        return web.Response(status=206, body=view, content_type=OCTETS, headers=headers)
    if CBOR in request.headers.get("Accept", ""):
        # The CBOR form carries the metadata too (dtype/shape of a tensor put).
        body = await _offload(head.size, lambda: cbor2.dumps({"data": bytes(view), "etag": head.etag,
                                                               "meta": head.meta}))
        return web.Response(body=body, content_type=CBOR, headers=headers)
    return web.Response(body=view, content_type=OCTETS, headers=headers)


async def head_object(request: web.Request) -> web.Response:
    uri, name = _name(request)
    mlc = request.app[MLC_KEY]
    check = policy.may_read(request_peer(request), name)
    head = await _store(mlc, lambda: mlc.head(uri, check=check))
    # aiohttp keeps an explicit Content-Length on a bodiless HEAD response.
    return web.Response(status=200, headers={
        "ETag": head.etag, "MLC-Tier": head.tier, "MLC-Leased": "1" if head.leased else "0",
        "Content-Type": OCTETS, "Content-Length": str(head.size),
    })


async def delete_object(request: web.Request) -> web.Response:
    uri, name = _name(request)
    mlc = request.app[MLC_KEY]
    check = policy.may_delete(request_peer(request), name)
    await _store(mlc, lambda: mlc.delete(uri, check=check))
    return web.Response(status=204)


async def _cbor_map(request: web.Request) -> dict[str, Any]:
    msg = cbor.decode(bytes(await read_body(request, MAX_SMALL_BODY)))
    if not isinstance(msg, dict):
        raise BadRequest("body must be a CBOR map")
    return msg


async def create_lease(request: web.Request) -> web.Response:
    msg = await _cbor_map(request)
    uri = msg.get("uri")
    if not isinstance(uri, str):
        raise BadRequest("lease body is {uri: tstr, ttl_ms: uint}")
    name = served_name(uri)
    ttl = _ttl(msg.get("ttl_ms"), "ttl_ms")
    peer = request_peer(request)
    mlc = request.app[MLC_KEY]
    check = policy.may_lease(peer, name)
    lease = await _store(mlc, lambda: mlc.lease(uri, ttl, holder=policy.principal(peer), check=check))
    return web.Response(status=201, body=cbor2.dumps({"lease": lease}), content_type=CBOR)


async def renew_lease(request: web.Request) -> web.Response:
    ttl = _ttl((await _cbor_map(request)).get("ttl_ms"), "ttl_ms")
    mlc, lease, check = request.app[MLC_KEY], request.match_info["lease"], policy.may_hold(request_peer(request))
    await _store(mlc, lambda: mlc.renew(lease, ttl, check=check))
    return web.Response(status=204)


async def release_lease(request: web.Request) -> web.Response:
    mlc, lease, check = request.app[MLC_KEY], request.match_info["lease"], policy.may_hold(request_peer(request))
    await _store(mlc, lambda: mlc.release(lease, check=check))
    return web.Response(status=204)


def _logs(request: web.Request) -> LogDirectory:
    logs = request.app.get(LOGS_KEY)
    if logs is None:
        raise UnknownLog("this MLC serves no commit logs")
    return logs


async def read_log(request: web.Request) -> web.Response:
    uri, _ = _name(request, log=True)
    policy.may_read_log(request_peer(request))
    start = _query_uint(request, "from", 18) or 0
    logs = _logs(request)
    if not logs.exists(uri):
        raise UnknownLog(f"no record was ever appended to {uri}")

    def read() -> tuple[str, bytes]:
        view = logs.log(uri).read(start)
        return view.etag, b"".join(encode_record(r) for r in view.records)

    etag, body = await asyncio.get_running_loop().run_in_executor(None, read)
    return web.Response(body=body, content_type=CBOR_SEQ, headers={"ETag": etag, "Log-Start": str(start)})


async def append_log(request: web.Request) -> web.Response:
    uri, _ = _name(request, log=True)
    peer = request_peer(request)
    policy.may_append_some(peer)  # refused before the body is read
    log_ = _logs(request).log(uri)
    try:
        body = await read_body(request, MAX_RECORD)
    except BodyTooLarge as exc:
        raise RecordTooLarge(exc.detail, extra=exc.extra) from None  # what every log backend says
    record = decode_record(bytes(body))
    policy.may_append(peer, record)
    if_match = request.headers.get("If-Match")
    etag = await asyncio.get_running_loop().run_in_executor(None, log_.append, record, if_match)
    return web.Response(status=201, headers={"ETag": etag})


async def stats(request: web.Request) -> web.Response:
    policy.may_see_stats(request_peer(request))
    mlc = request.app[MLC_KEY]
    return web.Response(body=json.dumps(await _store(mlc, mlc.stats)), content_type="application/json")


class _StatsCollector:
    """One scrape's accounting as Prometheus families (prometheus-client writes the text)."""

    _FIELDS = {"bytes": "gauge", "objects": "gauge", "hits": "counter", "misses": "counter", "evictions": "counter"}

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        for field, kind in self._FIELDS.items():
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
                f"sdcp_mlc_{field}", f"MLC {field} per scope and tier", labels=["scope", "tier"])
            for scope, tiers in stats["scopes"].items():
                for tier, counters in tiers.items():
                    family.add_metric([scope, tier], counters[field])
            yield family
        for key in ("used", "capacity"):
            family = GaugeMetricFamily(f"sdcp_mlc_tier_{key}_bytes", f"bytes {key} per tier", labels=["tier"])
            for tier in stats["tiers"]:
                family.add_metric([tier["name"]], tier[key])
            yield family
        yield GaugeMetricFamily("sdcp_mlc_leases", "leases held", value=stats["leases"])
        yield GaugeMetricFamily("sdcp_mlc_index_objects", "objects in the index", value=stats["index"]["objects"])
        yield GaugeMetricFamily("sdcp_mlc_index_bytes", "bytes in the index", value=stats["index"]["bytes"])


def prometheus_text(stats: dict[str, Any]) -> str:
    """The accounting in Prometheus' text exposition format, written by prometheus-client."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatsCollector(stats))
    return generate_latest(registry).decode()


async def metrics(request: web.Request) -> web.Response:
    policy.may_see_stats(request_peer(request))
    mlc = request.app[MLC_KEY]
    text = prometheus_text(await _store(mlc, mlc.stats))
    return web.Response(text=text, content_type="text/plain", charset="utf-8", headers={"Cache-Control": "no-store"})


def init_app(mlc: MLC, logs: LogDirectory | None = None, *, inflight_bytes: int = MAX_INFLIGHT,
             on_close: Callable[[], None] | None = None) -> web.Application:
    """The MLC's application: objects and leases of ``mlc``, commit logs of ``logs`` (none
    when None), at most ``inflight_bytes`` of object bodies held at once; ``on_close`` runs
    at clean-up (e.g. ``EmbeddedStore.close``)."""
    app = web.Application(middlewares=[problems], client_max_size=MAX_BODY)
    app[MLC_KEY] = mlc
    app[BUDGET_KEY] = UploadBudget(inflight_bytes)
    if logs is not None:
        app[LOGS_KEY] = logs
    obj = "/objects/{name:.+}"
    app.router.add_put(obj, put_object)
    app.router.add_get(obj, get_object, allow_head=False)
    app.router.add_route("HEAD", obj, head_object)
    app.router.add_delete(obj, delete_object)
    app.router.add_post("/leases", create_lease)
    app.router.add_put("/leases/{lease}", renew_lease)
    app.router.add_delete("/leases/{lease}", release_lease)
    app.router.add_get("/logs/{name:.+}", read_log)
    app.router.add_post("/logs/{name:.+}", append_log)
    app.router.add_get("/stats", stats)
    app.router.add_get("/metrics", metrics)
    if on_close is not None:
        async def closing(app: web.Application) -> Any:
            yield
            on_close()

        app.cleanup_ctx.append(closing)
    return app


def server_ssl(cert: str, key: str, ca: str | None = None) -> ssl.SSLContext:
    """TLS 1.3 server context; with ``ca`` a client certificate signed by it is required (mTLS)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    if ca:
        ctx.load_verify_locations(ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
