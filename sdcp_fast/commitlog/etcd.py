"""Commit log on etcd, for verifiers and routers on several machines.

Spoken over etcd's v3 JSON gateway (``POST /v3/kv/txn``), so no client library is needed.
Layout under the prefix: ``head`` (record count, 20 decimal digits), ``fence`` (highest
fenced epoch, 20 digits) and ``r/<index, 20 digits>`` per record. Fixed-width decimals
compare as etcd compares values (bytewise), so one transaction guards an append with
``head == expected count`` and ``fence < epoch + 1`` and writes the record, the new head
and, for a fence record, the new fence: the tag check and fencing are atomic.

etcd refuses a request over ``--max-request-bytes`` (1.5 MiB by default) after the
gateway's base64 and JSON wrapping, so records over ``MAX_RECORD`` (1 MiB) are refused here,
before anything is sent, as ``RecordTooLarge``.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
from typing import Any, ClassVar
from urllib.parse import urlsplit

from sdcp_fast.commitlog.backend import (
    LogView,
    PreconditionFailed,
    RecordTooLarge,
    etag_of,
    fence_error,
    length_of,
)
from sdcp_fast.protocol.commitlog import FenceRecord, LogRecord, decode_record, encode_record

MAX_RECORD = 1 << 20


def _pad(n: int) -> str:
    return f"{n:020d}"


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode()


class EtcdError(RuntimeError):
    pass


class EtcdGateway:
    """Minimal client of etcd's JSON gateway: one keep-alive connection, one request at a time."""

    def __init__(self, host: str, port: int, *, timeout: float = 5.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        with self._lock:
            for attempt in (0, 1):
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                try:
                    self._conn.request("POST", path, payload, {"Content-Type": "application/json"})
                    resp = self._conn.getresponse()
                    data = resp.read()
                    break
                except (ConnectionError, http.client.HTTPException, OSError):
                    self._conn.close()
                    self._conn = None
                    if attempt:
                        raise
        if resp.status != 200:
            raise EtcdError(f"etcd {path}: HTTP {resp.status} {data[:200]!r}")
        out: dict[str, Any] = json.loads(data)
        return out

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _kvs(response: dict[str, Any]) -> list[dict[str, Any]]:
    rng = response.get("response_range") or response.get("responseRange") or {}
    kvs: list[dict[str, Any]] = rng.get("kvs", [])
    return kvs


def _value(kv: dict[str, Any]) -> bytes:
    return base64.b64decode(kv.get("value", ""))


class EtcdCommitLog:
    enforces_fencing: ClassVar[bool] = True
    max_record = MAX_RECORD

    def __init__(self, host: str, port: int, prefix: str) -> None:
        self.prefix = "/" + prefix.strip("/")
        self.ref = f"etcd://{host}:{port}{self.prefix}"
        self._etcd = EtcdGateway(host, port)
        self._head = f"{self.prefix}/head"
        self._fence = f"{self.prefix}/fence"
        self._rec = f"{self.prefix}/r/"
        # Create head and fence once; a value compare on a missing key always fails in etcd.
        self._etcd.call("/v3/kv/txn", {
            "compare": [{"key": _b64(self._head), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": _b64(self._head), "value": _b64(_pad(0))}},
                        {"request_put": {"key": _b64(self._fence), "value": _b64(_pad(0))}}],
        })

    @classmethod
    def from_ref(cls, ref: str) -> EtcdCommitLog:
        parts = urlsplit(ref)
        if parts.scheme != "etcd" or not parts.hostname or not parts.port or not parts.path.strip("/"):
            raise ValueError(f"expected etcd://host:port/prefix, got {ref!r}")
        return cls(parts.hostname, parts.port, parts.path)

    def _range_op(self, key: str, end: str | None = None) -> dict[str, Any]:
        req: dict[str, Any] = {"key": _b64(key)}
        if end is not None:
            req["range_end"] = _b64(end)
        return {"request_range": req}

    def read(self, start: int = 0) -> LogView:
        # One transaction: the head and the records come from the same revision.
        out = self._etcd.call("/v3/kv/txn", {"success": [
            self._range_op(self._head),
            self._range_op(self._rec + _pad(start), self.prefix + "/r0"),  # '0' follows '/'
        ]})
        head_resp, recs_resp = out["responses"]
        length = int(_value(_kvs(head_resp)[0]))
        records = [decode_record(_value(kv)) for kv in _kvs(recs_resp)]
        return LogView(records[: max(0, length - start)], start, etag_of(length))

    def append(self, record: LogRecord, if_match: str | None) -> str:
        body = encode_record(record)
        if len(body) > MAX_RECORD:
            raise RecordTooLarge(f"record of {len(body)} bytes; an etcd log holds records up to {MAX_RECORD}",
                                 extra={"limit": MAX_RECORD})
        while True:
            try:
                n = length_of(if_match) if if_match is not None else length_of(self.read(1 << 62).etag)
                if n >= 10 ** 20:
                    raise PreconditionFailed(f"log never had {if_match} records")
            except PreconditionFailed:
                self._raise_if_fenced(record)  # a fence answers first, whatever the tag
                raise
            puts = [{"request_put": {"key": _b64(self._rec + _pad(n)), "value": _b64(body)}},
                    {"request_put": {"key": _b64(self._head), "value": _b64(_pad(n + 1))}}]
            if isinstance(record, FenceRecord):
                puts.append({"request_put": {"key": _b64(self._fence), "value": _b64(_pad(record.epoch))}})
            out = self._etcd.call("/v3/kv/txn", {
                "compare": [
                    {"key": _b64(self._head), "target": "VALUE", "result": "EQUAL", "value": _b64(_pad(n))},
                    {"key": _b64(self._fence), "target": "VALUE", "result": "LESS",
                     "value": _b64(_pad(record.epoch + 1))},
                ],
                "success": puts,
                "failure": [self._range_op(self._head), self._range_op(self._fence)],
            })
            if out.get("succeeded"):
                return etag_of(n + 1)
            head_resp, fence_resp = out["responses"]
            fence = int(_value(_kvs(fence_resp)[0]))
            if fence > record.epoch:
                raise fence_error(fence, record)
            if if_match is not None:
                length = int(_value(_kvs(head_resp)[0]))
                raise PreconditionFailed(f"log has {length} records, not {if_match}")
            # Unconditional append lost a race: take the new head and try again.

    def _raise_if_fenced(self, record: LogRecord) -> None:
        out = self._etcd.call("/v3/kv/txn", {"success": [self._range_op(self._fence)]})
        fence = int(_value(_kvs(out["responses"][0])[0]))
        if fence > record.epoch:
            raise fence_error(fence, record)

    def close(self) -> None:
        self._etcd.close()
