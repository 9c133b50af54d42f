"""The MLC server: the HTTP API of the store (a KVSP-like object API) and of its commit logs,
independent of the transport that carries it.

Objects (``<name>`` is an ``mlc://<scope>/<session>/<kind>[/<round>]`` URI without its scheme):
  PUT    /objects/<name>[?lease_ms=N]   raw body, or application/cbor {data, ? lease_ms, ? meta}
  GET    /objects/<name>                raw bytes; ``Range: bytes=a-b`` gives 206;
                                        ``Accept: application/cbor`` gives {data, etag, meta}
  HEAD   /objects/<name>                Content-Length (and MLC-Size), ETag, MLC-Tier, MLC-Leased
  DELETE /objects/<name>
Leases: POST /leases {uri, ttl_ms} -> {lease}; PUT /leases/<id> {ttl_ms}; DELETE /leases/<id>
  (``?drop=1``: the release of a birth lease deletes its object once no other lease holds it)
Commit logs: GET /logs/<name>?from=n (application/cbor-seq of records, ETag of the log; 404
  for a log never appended to); POST /logs/<name> with one CBOR record and If-Match (412 on
  a stale tag, 409 sdcp-stale-epoch when fenced, 413 over the record limit); POST /logs
  (group commit) with CBOR {appends: [{log, record, ? if_match}]}: every entry checked and
  answered on its own, one flush for all, 200 CBOR {results: [{status, etag} or a problem]}.
Metrics: GET /stats (JSON), GET /metrics (Prometheus text).

:class:`MLCService` holds the routes; each runs on a :class:`~.server_requests.Call` (a
request as the routes see it) and returns a transport
:class:`~sdcp_fast.transport.base.Response`. Two servers carry it: :func:`serve` on the
project's HTTP/2 + mutual TLS transport (the default, ``sdcp-fast mlc``), and the aiohttp
HTTP/1.1 application of :mod:`.server_http1` (``--http1``, for debugging), which streams
bodies in against their limit. Errors are RFC 9457 problem details, never tracebacks
(:func:`~.server_requests.answer_for`). With client certificates every request is authorized by
:mod:`sdcp_fast.cache.policy` (docs/security.md), before the store is touched. Large
bodies are encoded, decoded and copied on worker threads, never on the event loop. CBOR
bodies are read and written with the project's codec (:mod:`sdcp_fast.protocol.cbor`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from sdcp_fast.cache import policy
from sdcp_fast.cache.failures import BadRange, ObjectUnavailable
from sdcp_fast.cache.index import MAX_LEASE_TTL, MLC
from sdcp_fast.cache.uri import SCHEME, ObjectName, served_name
from sdcp_fast.commitlog.backend import RecordTooLarge, UnknownLog
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.commitlog.file import MAX_RECORD
from sdcp_fast.commitlog.http import MAX_BATCH_BODY
from sdcp_fast.mlc_server.committer import Committer
from sdcp_fast.mlc_server.records import decode_stored_record
from sdcp_fast.mlc_server.server_metrics import prometheus_text
from sdcp_fast.mlc_server.server_requests import (
    BodyTooLarge,
    Call,
    UploadBudget,
    answer_for,
    release_body,
)
from sdcp_fast.mlc_server.server_shm import (
    ASK,
    release_spent,
    round_in_slot,
    shm_tier,
    slot_headers,
    spent_leases,
    upload,
)
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.peer import Peer
from sdcp_fast.protocol.problems import BadRequest
from sdcp_fast.store.local_store import INLINE_BYTES, run_on
from sdcp_fast.transport.base import Request, Response
from sdcp_fast.transport.problem import http_problem
from sdcp_fast.transport.routes import NoRoute, RouteTable

CBOR = "application/cbor"
CBOR_SEQ = "application/cbor-seq"
OCTETS = "application/octet-stream"
MAX_BODY = 1 << 30  # an object upload
MAX_SMALL_BODY = 4 << 10  # a lease request
MAX_LEASE_MS = int(MAX_LEASE_TTL * 1000)
# Object bodies held at once, over all uploads in flight: concurrent uploads cannot hold
# more memory than this however many clients send them.
MAX_INFLIGHT = 2 << 30

log = logging.getLogger(__name__)


async def _offload(size: int, fn: Callable[[], Any]) -> Any:
    if size <= INLINE_BYTES:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _name(name: str, *, log: bool = False) -> tuple[str, ObjectName]:
    uri = SCHEME + name
    return uri, served_name(uri, log=log)


def _ttl(value: Any, field: str) -> float:
    """A lease TTL in milliseconds on the wire: a uint in [1, MAX_LEASE_MS]; seconds back."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LEASE_MS:
        raise BadRequest(f"{field} must be an integer number of milliseconds in [1, {MAX_LEASE_MS}]",
                         extra={"max_ms": MAX_LEASE_MS})
    return value / 1000.0


def _query_uint(query: Mapping[str, str], field: str, digits: int) -> int | None:
    text = query.get(field)
    if text is None:
        return None
    if not re.fullmatch(rf"\d{{1,{digits}}}", text):
        raise BadRequest(f"{field} must be a decimal uint of at most {digits} digits")
    return int(text)


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


# The headers of every group commit's answer (read-only: the native server frames them once).
_CBOR_HEADERS: Mapping[str, str] = MappingProxyType({"content-type": CBOR})


def _cbor_response(doc: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(status, cbor.deterministic_cbor(doc), {"content-type": CBOR, **(headers or {})})


# The route (an MLCService method) of each request; a path no pattern takes is 404, a method
# its pattern does not list 405.
ROUTES = RouteTable[str]()
for _method, _pattern, _route in [
    ("PUT", r"objects/(?P<name>.+)", "put_object"), ("GET", r"objects/(?P<name>.+)", "get_object"),
    ("HEAD", r"objects/(?P<name>.+)", "head_object"), ("DELETE", r"objects/(?P<name>.+)", "delete_object"),
    ("POST", r"leases", "create_lease"),
    ("PUT", r"leases/(?P<lease>[^/]+)", "renew_lease"), ("DELETE", r"leases/(?P<lease>[^/]+)", "release_lease"),
    ("GET", r"logs/(?P<name>.+)", "read_log"), ("POST", r"logs/(?P<name>.+)", "append_log"),
    ("POST", r"logs", "append_logs"),
    ("GET", r"stats", "stats"), ("GET", r"metrics", "metrics"), ("GET", r"shm", "shm_info"),
]:
    ROUTES.add(_method, _pattern, _route)


class MLCService:
    """The MLC's routes over ``mlc`` (objects, leases) and ``logs`` (commit logs; none when
    None), holding at most ``inflight_bytes`` of object bodies at once."""

    def __init__(self, mlc: MLC, logs: LogDirectory | None = None, *, inflight_bytes: int = MAX_INFLIGHT) -> None:
        self.mlc = mlc
        self.logs = logs
        self.budget = UploadBudget(inflight_bytes)
        self.shm = shm_tier(mlc)  # same-host objects in shared memory (server_shm.py), if kept
        self.committer: Committer | None = None  # started at the first group commit

    def close(self) -> None:
        """Stop the commit thread, once the group commits queued are answered."""
        if self.committer is not None:
            self.committer.close()

    # -- the transport Handler (HTTP/2) -----------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        return await self.handler(request)

    async def handler(self, request: Request) -> Response:
        """:data:`~sdcp_fast.transport.base.Handler`: route ``request``; problems, never raises."""
        call = Call(request.method, request.path, request.query, request.headers, request.peer, request.body)
        try:
            response = await self.dispatch(call)
        except Exception as exc:
            response = answer_for(exc, request.method, "/" + request.path)
        if request.method == "HEAD" and response.body:
            # A HEAD answer carries no body (RFC 9110 §9.3.2; an HTTP/2 peer resets a stream
            # that sends one): a refused HEAD says what it is by its status alone.
            response = Response(response.status, b"", response.headers)
        return response

    async def dispatch(self, call: Call) -> Response:
        try:
            route, groups = ROUTES.match(call.method, call.path)
        except NoRoute as none:
            if not none.allowed:
                return http_problem(404, f"no route for /{call.path}")
            allowed = ", ".join(none.allowed)
            response = http_problem(405, f"{call.method} /{call.path}: allowed {allowed}")
            return Response(405, response.body, {**response.headers, "allow": allowed})
        out: Response = await getattr(self, route)(call, **groups)
        return out

    # -- objects ------------------------------------------------------------------------------

    async def put_object(self, call: Call, name: str) -> Response:
        mlc, budget = self.mlc, self.budget
        uri, parsed = _name(name)
        peer = call.peer
        check = policy.may_put(peer, parsed)  # refused before the body is read
        lease_ms: Any = _query_uint(call.query, "lease_ms", 10)
        body = await call.body(MAX_BODY, budget)
        token = call.query.get("shm")
        try:
            if token is not None:  # the bytes are an upload in shared memory: a slot adopts it
                ttl = None if lease_ms is None else _ttl(lease_ms, "lease_ms")
                spent = spent_leases(call.query.get("release"))
                with upload(self.shm, token, len(body), ttl) as up:
                    stored = await run_on(mlc, lambda: mlc.put(uri, up, ttl, owner=policy.principal(peer),
                                                               check=check))
                if spent:  # the writer's last rounds' leases, let go of with this put
                    await run_on(mlc, lambda: release_spent(mlc, peer, spent))
                return self._stored(stored)
            meta = None
            data: Any = body
            if call.content_type == CBOR:
                # Untrusted input: the strict decoder only raises BadRequest.
                msg = await _offload(len(body), lambda: cbor.decode(body))
                if not isinstance(msg, dict) or not isinstance(msg.get("data"), bytes):
                    raise BadRequest("CBOR object body is {data: bstr, ? lease_ms: uint, ? meta: map}")
                data, meta = msg["data"], msg.get("meta")
                lease_ms = msg.get("lease_ms", lease_ms)
                if meta is not None and not (isinstance(meta, dict) and all(isinstance(k, str) for k in meta)):
                    raise BadRequest("meta must be a map with text keys")
            ttl = None if lease_ms is None else _ttl(lease_ms, "lease_ms")
            # A body the host tier keeps as it came (no copy, nothing moved) is put inline: the
            # thread hop would cost more than the put.
            moves = 0 if mlc.stores_as_is(data, len(data), uri) else len(body)
            stored = await run_on(mlc, lambda: mlc.put(uri, data, ttl, meta=meta, owner=policy.principal(peer),
                                                       check=check), moves)  # data and meta
        finally:
            budget.give(len(body))
            release_body(body)
        return self._stored(stored)

    @staticmethod
    def _stored(stored: Any) -> Response:
        out = {"etag": stored.etag, "tier": stored.tier}
        if stored.lease is not None:
            out["lease"] = stored.lease
        return _cbor_response(out, 201, {"etag": stored.etag})

    async def get_object(self, call: Call, name: str) -> Response:
        mlc = self.mlc
        uri, parsed = _name(name)
        check = policy.may_read(call.peer, parsed)
        spec = call.headers.get("range")
        span = None if spec is None else _span(spec)
        # Where to read: inline when the answer is a view of bytes in memory (the thread hop
        # would cost more), else on a worker thread. The answer's head comes with the bytes.
        try:
            before = await run_on(mlc, lambda: mlc.head(uri))
        except ObjectUnavailable:  # a round's q rows may be in their writer's slot (server_shm.py)
            if span is not None or (rows := round_in_slot(mlc, self.shm, uri, check)) is None:
                raise
            return Response(200, rows[1], {"etag": rows[0].etag, "mlc-tier": rows[0].tier, "content-type": OCTETS})
        hint = 0 if mlc.reads_as_view(before) else before.size
        # One step: the entity tag sent is the one of the bytes sent, whatever puts race with us.
        head, view = await run_on(mlc, lambda: mlc.read(uri, span, check=check), hint)
        headers = {"etag": head.etag, "accept-ranges": "bytes", "mlc-tier": head.tier}
        slot = slot_headers(self.shm, head, view) if span is None and ASK in call.headers else None
        if slot is not None:  # a reader on this host maps the slot itself
            return Response(200, b"", {**headers, **slot, "content-type": OCTETS})
        if span is not None:
            start, stop = span(head.size)
            headers["content-range"] = f"bytes {start}-{stop - 1}/{head.size}"
            # A view of the stored bytes: the transports send any buffer, so no copy is made.
            return Response(206, view, {**headers, "content-type": OCTETS})  # type: ignore[arg-type]
        if CBOR in call.headers.get("accept", ""):
            # The CBOR form carries the metadata too (dtype/shape of a tensor put).
            body = await _offload(head.size, lambda: cbor.deterministic_cbor(
                {"data": bytes(view), "etag": head.etag, "meta": head.meta}))
            return Response(200, body, {**headers, "content-type": CBOR})
        return Response(200, view, {**headers, "content-type": OCTETS})  # type: ignore[arg-type]

    async def head_object(self, call: Call, name: str) -> Response:
        uri, parsed = _name(name)
        mlc = self.mlc
        check = policy.may_read(call.peer, parsed)
        head = await run_on(mlc, lambda: mlc.head(uri, check=check))
        # MLC-Size: an HTTP/2 server may give a bodiless answer Content-Length 0.
        return Response(200, b"", {
            "etag": head.etag, "mlc-tier": head.tier, "mlc-leased": "1" if head.leased else "0",
            "content-type": OCTETS, "content-length": str(head.size), "mlc-size": str(head.size),
        })

    async def delete_object(self, call: Call, name: str) -> Response:
        uri, parsed = _name(name)
        mlc = self.mlc
        check = policy.may_delete(call.peer, parsed)
        await run_on(mlc, lambda: mlc.delete(uri, check=check))
        return Response(204)

    # -- leases -------------------------------------------------------------------------------

    async def _cbor_map(self, call: Call) -> dict[str, Any]:
        msg = cbor.decode(bytes(await call.body(MAX_SMALL_BODY)))
        if not isinstance(msg, dict):
            raise BadRequest("body must be a CBOR map")
        return msg

    async def create_lease(self, call: Call) -> Response:
        msg = await self._cbor_map(call)
        uri = msg.get("uri")
        if not isinstance(uri, str):
            raise BadRequest("lease body is {uri: tstr, ttl_ms: uint}")
        parsed = served_name(uri)
        ttl = _ttl(msg.get("ttl_ms"), "ttl_ms")
        peer, mlc = call.peer, self.mlc
        check = policy.may_lease(peer, parsed)
        lease = await run_on(mlc, lambda: mlc.lease(uri, ttl, holder=policy.principal(peer), check=check))
        return _cbor_response({"lease": lease}, 201)

    async def renew_lease(self, call: Call, lease: str) -> Response:
        ttl = _ttl((await self._cbor_map(call)).get("ttl_ms"), "ttl_ms")
        mlc, check = self.mlc, policy.may_hold(call.peer)
        await run_on(mlc, lambda: mlc.renew(lease, ttl, check=check))
        return Response(204)

    async def release_lease(self, call: Call, lease: str) -> Response:
        mlc, check = self.mlc, policy.may_hold(call.peer)
        drop = call.query.get("drop") == "1"  # a birth lease's object is spent: deleted with it
        await run_on(mlc, lambda: mlc.release(lease, drop=drop, check=check))
        return Response(204)

    # -- commit logs --------------------------------------------------------------------------

    def _logs(self) -> LogDirectory:
        if self.logs is None:
            raise UnknownLog("this MLC serves no commit logs")
        return self.logs

    def _log_to_read(self, name: str, query: Mapping[str, str], peer: Peer | None) -> tuple[LogDirectory, str, int]:
        """The logs, URI and first record of ``GET /logs/<name>``: its problems (400, 403, and
        404 for a log never appended to) raised before anything is read."""
        uri, _ = _name(name, log=True)
        policy.may_read_log(peer)
        start = _query_uint(query, "from", 18) or 0
        logs = self._logs()
        if not logs.exists(uri):
            raise UnknownLog(f"no record was ever appended to {uri}")
        return logs, uri, start

    async def read_log(self, call: Call, name: str) -> Response:
        logs, uri, start = self._log_to_read(name, call.query, call.peer)
        etag, body = await asyncio.get_running_loop().run_in_executor(None, logs.log(uri).read_encoded, start)
        return Response(200, body, {"content-type": CBOR_SEQ, "etag": etag, "log-start": str(start)})

    async def append_log(self, call: Call, name: str) -> Response:
        uri, _ = _name(name, log=True)
        peer = call.peer
        policy.may_append_some(peer)  # refused before the body is read
        log_ = self._logs().log(uri)
        try:
            body = await call.body(MAX_RECORD)
        except BodyTooLarge as exc:
            raise RecordTooLarge(exc.detail, extra=exc.extra) from None  # what every log backend says
        if_match = call.headers.get("if-match")

        def append() -> str:
            # A record is up to MAX_RECORD bytes of untrusted CBOR, off the loop; only the
            # members the format defines are built, so no other thread waits on the GIL for it.
            record = decode_stored_record(bytes(body))
            policy.may_append(peer, record)
            return log_.append(record, if_match)

        try:
            etag = await asyncio.get_running_loop().run_in_executor(None, append)
        finally:
            release_body(body)
        return Response(201, b"", {"etag": etag})

    async def append_logs(self, call: Call) -> Response:
        """Group commit: CBOR ``{appends: [{log, record, ? if_match}]}`` (``log`` as in the
        path of ``POST /logs/<name>``, ``record`` one CBOR record as that route's body); each
        entry is authorized, checked (fence, then tag) and answered on its own, and all are
        flushed once (:mod:`.committer`). A body that is not that shape is 400 as a whole;
        more than ``MAX_BATCH`` entries 413."""
        peer = call.peer
        policy.may_append_some(peer)  # refused before the body is read
        commits = self._commits()
        body = await call.body(MAX_BATCH_BODY)
        try:
            answer = await commits.submit(body, peer)
        finally:
            release_body(body)
        return Response(200, answer, _CBOR_HEADERS)

    def _commits(self) -> Committer:
        if self.committer is None:
            self.committer = Committer(self._logs())
        return self.committer

    # -- the direct route (the native server asks it first) --------------------------------

    def answer_now(self, method: str, path: str, query: Mapping[str, str], body: bytes, headers: Mapping[str, str],
                   peer: Peer | None) -> Response | asyncio.Future[Any] | None:
        """:class:`~sdcp_fast.transport.base.DirectHandler`: a group commit (``POST /logs``, one
        per scoring pass of a verifier) goes to the commit thread with no request object, task
        or coroutine, and a read of a log that does not exist (what a session's open asks) or
        may not be read is answered at once; every other request takes :meth:`handler`."""
        if method == "GET" and path.startswith("logs/") and len(path) > len("logs/"):
            try:
                self._log_to_read(path[len("logs/"):], query, peer)
            except Exception as exc:
                return answer_for(exc, method, "/" + path)
            return None  # a log to read: on a worker thread, by the general route
        if path != "logs" or method != "POST":
            return None
        try:
            policy.may_append_some(peer)
            commits = self._commits()
            declared = headers.get("content-length")
            if len(body) > MAX_BATCH_BODY or (declared is not None and declared.isdigit()
                                              and int(declared) > MAX_BATCH_BODY):
                raise BodyTooLarge(f"body over {MAX_BATCH_BODY} bytes; this route takes at most {MAX_BATCH_BODY}",
                                   extra={"limit": MAX_BATCH_BODY})
            return commits.submit(body, peer)
        except Exception as exc:
            return answer_for(exc, method, "/logs")

    def settled(self, future: asyncio.Future[Any]) -> Response:
        error = future.exception()  # CancelledError when it was cancelled
        if error is None:
            return Response(200, future.result(), _CBOR_HEADERS)
        return answer_for(error if isinstance(error, Exception) else RuntimeError(repr(error)), "POST", "/logs")

    async def shm_info(self, call: Call) -> Response:
        """Where a client on this host finds the slots (server_shm.py); 404 when none are kept."""
        if self.shm is None:
            return http_problem(404, "this MLC keeps no objects in shared memory")
        return _cbor_response({"folder": self.shm.folder, "token": self.shm.token, "adopted": self.shm.adopted})

    # -- accounting ---------------------------------------------------------------------------

    async def stats(self, call: Call) -> Response:
        policy.may_see_stats(call.peer)
        mlc = self.mlc
        body = json.dumps(await run_on(mlc, mlc.stats)).encode()
        return Response(200, body, {"content-type": "application/json"})

    async def metrics(self, call: Call) -> Response:
        policy.may_see_stats(call.peer)
        mlc = self.mlc
        text = prometheus_text(await run_on(mlc, mlc.stats))
        return Response(200, text.encode(), {"content-type": "text/plain; charset=utf-8", "cache-control": "no-store"})


# DATA frames the MLC asks its peers for: h2's frame buffer re-copies a frame's bytes on each
# read until the frame is complete, so 1 MiB frames cost several copies per MiB received;
# 256 KiB frames put and get 1 MiB bodies ~3x faster here (docs/mlc.md, bench/mlc.py).
MAX_FRAME = 256 << 10


def limits() -> Any:
    """The HTTP/2 server's bounds for the MLC: a request body up to an object's limit, and
    bodies still arriving over all connections up to the upload budget (as over HTTP/1.1)."""
    from sdcp_fast.transport.h2conn import Limits

    return Limits(max_body=MAX_BODY, max_frame=MAX_FRAME, max_buffered_total=MAX_INFLIGHT)


async def serve(service: MLCService, host: str, port: int, *, ssl: ssl.SSLContext | None,
                insecure: bool = False) -> Any:
    """Serve ``service`` over HTTP/2 (``ssl``: a :func:`~sdcp_fast.transport.tls.server_context`,
    client certificates required); returns the :class:`~sdcp_fast.transport.h2server.H2Server`."""
    from sdcp_fast.transport.h2server import serve as serve_h2

    return await serve_h2(service, host, port, ssl=ssl, insecure=insecure, limits=limits())
