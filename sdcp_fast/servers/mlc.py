"""HTTP API of the MLC (a KVSP-like object API) and of its commit logs.

Objects (``<name>`` is an ``mlc://`` URI without its scheme):
  PUT    /objects/<name>[?lease_ms=N]   raw body, or application/cbor {data, ? lease_ms, ? meta}
  GET    /objects/<name>                raw bytes; ``Range: bytes=a-b`` gives 206;
                                        ``Accept: application/cbor`` gives {data, etag, meta}
  HEAD   /objects/<name>                Content-Length, ETag, MLC-Tier, MLC-Leased
  DELETE /objects/<name>
Leases: POST /leases {uri, ttl_ms} -> {lease}; PUT /leases/<id> {ttl_ms}; DELETE /leases/<id>
Commit logs: GET /logs/<name>?from=n (application/cbor-seq of records, ETag of the log);
  POST /logs/<name> with one CBOR record and If-Match (412 on a stale tag, 409
  sdcp-stale-epoch when fenced).
Metrics: GET /stats (JSON), GET /metrics (Prometheus text). Errors are RFC 9457 problem details, never tracebacks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import cbor2
from aiohttp import web

from sdcp_fast.cache.errors import BadRange
from sdcp_fast.cache.store import MLC
from sdcp_fast.cache.uri import SCHEME
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import decode_record, encode_record
from sdcp_fast.protocol.problems import PROBLEM_MEDIA_TYPE, BadRequest, SdcpProblem

MLC_KEY = web.AppKey("mlc", MLC)
CBOR = "application/cbor"
CBOR_SEQ = "application/cbor-seq"
OCTETS = "application/octet-stream"
# Above this size, object bytes are copied on a worker thread, not on the event loop.
INLINE_BYTES = 256 << 10
MAX_BODY = 1 << 30

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InternalError(SdcpProblem):
    suffix = "mlc-internal"
    status = 500
    title = "MLC internal error"


def problem_response(problem: SdcpProblem) -> web.Response:
    return web.Response(status=problem.status, body=problem.render(), content_type=PROBLEM_MEDIA_TYPE)


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except SdcpProblem as p:
        return problem_response(p)
    except ValueError as exc:
        return problem_response(BadRequest(str(exc)))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own refusals (no such route, body too large, ...) as problem details too.
        body = json.dumps({"type": "about:blank", "title": exc.reason, "status": exc.status}).encode()
        return web.Response(status=exc.status, body=body, content_type=PROBLEM_MEDIA_TYPE)
    except Exception:
        log.exception("MLC request failed: %s %s", request.method, request.path)
        return problem_response(InternalError())


def _uri(request: web.Request) -> str:
    return SCHEME + request.match_info["name"]


async def _offload(request: web.Request, size: int, fn: Callable[[], Any]) -> Any:
    if size <= INLINE_BYTES:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _ttl(value: Any) -> float | None:
    if value is None:
        return None
    ms = int(value)
    if ms <= 0:
        raise ValueError("lease_ms must be positive")
    return ms / 1000.0


async def put_object(request: web.Request) -> web.Response:
    mlc = request.app[MLC_KEY]
    body = await request.read()
    lease_ms: Any = request.query.get("lease_ms")
    meta = None
    data: Any = body
    if request.content_type == CBOR:
        msg = cbor.decode(body)  # untrusted input: the strict decoder only raises BadRequest
        if not isinstance(msg, dict) or not isinstance(msg.get("data"), bytes):
            raise BadRequest("CBOR object body is {data: bstr, ? lease_ms: uint, ? meta: map}")
        data, lease_ms, meta = msg["data"], msg.get("lease_ms", lease_ms), msg.get("meta")
    uri = _uri(request)
    ttl = _ttl(lease_ms)
    stored = await _offload(request, len(data), lambda: mlc.put(uri, data, ttl, meta=meta))
    out = {"etag": stored.etag, "tier": stored.tier}
    if stored.lease is not None:
        out["lease"] = stored.lease
    return web.Response(status=201, body=cbor2.dumps(out), content_type=CBOR, headers={"ETag": stored.etag})


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


async def get_object(request: web.Request) -> web.Response:
    mlc = request.app[MLC_KEY]
    uri = _uri(request)
    head = mlc.head(uri)
    headers = {"ETag": head.etag, "Accept-Ranges": "bytes", "MLC-Tier": head.tier}
    spec = request.headers.get("Range")
    if spec is None:
        view = await _offload(request, head.size, lambda: mlc.get(uri))
        if CBOR in request.headers.get("Accept", ""):
            # The CBOR form carries the metadata too (dtype/shape of a tensor put).
            body = cbor2.dumps({"data": bytes(view), "etag": head.etag, "meta": head.meta})
            return web.Response(body=body, content_type=CBOR, headers=headers)
        return web.Response(body=view, content_type=OCTETS, headers=headers)
    m = _RANGE.match(spec.strip())
    if m is None or m.groups() == ("", ""):
        raise BadRange(f"unsupported Range {spec!r}")
    first, last = m.groups()
    if first == "":
        start, stop = max(0, head.size - int(last)), head.size
    else:
        start = int(first)
        stop = head.size if last == "" else min(int(last) + 1, head.size)
    if start >= head.size or stop < start:
        raise BadRange(f"{spec} outside {head.size} bytes", extra={"size": head.size})
    view = await _offload(request, stop - start, lambda: mlc.get_range(uri, start, stop))
    headers["Content-Range"] = f"bytes {start}-{stop - 1}/{head.size}"
    return web.Response(status=206, body=view, content_type=OCTETS, headers=headers)


async def head_object(request: web.Request) -> web.Response:
    head = request.app[MLC_KEY].head(_uri(request))
    # aiohttp keeps an explicit Content-Length on a bodiless HEAD response.
    return web.Response(status=200, headers={
        "ETag": head.etag, "MLC-Tier": head.tier, "MLC-Leased": "1" if head.leased else "0",
        "Content-Type": OCTETS, "Content-Length": str(head.size),
    })


async def delete_object(request: web.Request) -> web.Response:
    request.app[MLC_KEY].delete(_uri(request))
    return web.Response(status=204)


async def _cbor_map(request: web.Request) -> dict[str, Any]:
    msg = cbor.decode(await request.read())
    if not isinstance(msg, dict):
        raise BadRequest("body must be a CBOR map")
    return msg


async def create_lease(request: web.Request) -> web.Response:
    msg = await _cbor_map(request)
    uri, ttl = msg.get("uri"), _ttl(msg.get("ttl_ms"))
    if not isinstance(uri, str) or ttl is None:
        raise BadRequest("lease body is {uri: tstr, ttl_ms: uint}")
    lease = request.app[MLC_KEY].lease(uri, ttl)
    return web.Response(status=201, body=cbor2.dumps({"lease": lease}), content_type=CBOR)


async def renew_lease(request: web.Request) -> web.Response:
    ttl = _ttl((await _cbor_map(request)).get("ttl_ms"))
    if ttl is None:
        raise BadRequest("renewal body is {ttl_ms: uint}")
    request.app[MLC_KEY].renew(request.match_info["lease"], ttl)
    return web.Response(status=204)


async def release_lease(request: web.Request) -> web.Response:
    request.app[MLC_KEY].release(request.match_info["lease"])
    return web.Response(status=204)


async def read_log(request: web.Request) -> web.Response:
    log_ = request.app[MLC_KEY].commit_log(_uri(request))
    start = int(request.query.get("from", "0"))
    if start < 0:
        raise ValueError("from must be a uint")
    view = await asyncio.get_running_loop().run_in_executor(None, log_.read, start)
    body = b"".join(encode_record(r) for r in view.records)
    return web.Response(body=body, content_type=CBOR_SEQ, headers={"ETag": view.etag, "Log-Start": str(start)})


async def append_log(request: web.Request) -> web.Response:
    log_ = request.app[MLC_KEY].commit_log(_uri(request))
    record = decode_record(await request.read())
    if_match = request.headers.get("If-Match")
    etag = await asyncio.get_running_loop().run_in_executor(None, log_.append, record, if_match)
    return web.Response(status=201, headers={"ETag": etag})


async def stats(request: web.Request) -> web.Response:
    return web.Response(body=json.dumps(request.app[MLC_KEY].stats()), content_type="application/json")


def prometheus_text(stats: dict[str, Any]) -> str:
    """The accounting in Prometheus' text exposition format (one gauge or counter per field)."""
    lines = []
    kinds = {"bytes": "gauge", "objects": "gauge", "hits": "counter", "misses": "counter", "evictions": "counter"}
    for field, kind in kinds.items():
        metric = f"sdcp_mlc_{field}" + ("_total" if kind == "counter" else "")
        lines.append(f"# TYPE {metric} {kind}")
        for scope, tiers in stats["scopes"].items():
            for tier, counters in tiers.items():
                lines.append(f'{metric}{{scope="{scope}",tier="{tier}"}} {counters[field]}')
    lines.append("# TYPE sdcp_mlc_tier_used_bytes gauge")
    lines += [f'sdcp_mlc_tier_used_bytes{{tier="{t["name"]}"}} {t["used"]}' for t in stats["tiers"]]
    lines.append("# TYPE sdcp_mlc_tier_capacity_bytes gauge")
    lines += [f'sdcp_mlc_tier_capacity_bytes{{tier="{t["name"]}"}} {t["capacity"]}' for t in stats["tiers"]]
    lines.append("# TYPE sdcp_mlc_leases gauge")
    lines.append(f"sdcp_mlc_leases {stats['leases']}")
    return "\n".join(lines) + "\n"


async def metrics(request: web.Request) -> web.Response:
    text = prometheus_text(request.app[MLC_KEY].stats())
    return web.Response(text=text, content_type="text/plain", charset="utf-8", headers={"Cache-Control": "no-store"})


def init_app(mlc: MLC, *, close_mlc: bool = False) -> web.Application:
    app = web.Application(middlewares=[problems], client_max_size=MAX_BODY)
    app[MLC_KEY] = mlc
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
    if close_mlc:
        async def closing(app: web.Application) -> Any:
            yield
            app[MLC_KEY].close()

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
