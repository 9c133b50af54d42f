"""Commit log on etcd, for verifiers and routers on several machines.

Spoken over etcd's v3 JSON gateway (``POST /v3/kv/txn``), so no client library is needed.
Layout under the prefix: ``head`` (record count, 20 decimal digits), ``fence`` (highest
fenced epoch, 20 digits) and ``r/<index, 20 digits>`` per record. Fixed-width decimals
compare as etcd compares values (bytewise), so one transaction guards an append with
``head == expected count`` and ``fence < epoch + 1`` and writes the record, the new head
and, for a fence record, the new fence: the tag check and fencing are atomic.

A batch of appends (:func:`append_many`, group commit) goes as one transaction for up to 40
logs (one raft entry, one fsync at etcd); where one of those logs is fenced or has moved
on, the transaction writes nothing and each entry is then sent as a transaction of its own,
all pipelined on one connection (written before the first answer is read), and answered on
its own.

etcd refuses a request over ``--max-request-bytes`` (1.5 MiB by default) after the
gateway's base64 and JSON wrapping, so records over ``MAX_RECORD`` (1 MiB) are refused here,
before anything is sent, as ``RecordTooLarge``.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
from collections.abc import Sequence
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
        self._pipe: _Pipe | None = None
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

    def call_many(self, path: str, bodies: Sequence[dict[str, Any]]) -> list[dict[str, Any] | Exception]:
        """``bodies`` POSTed to ``path`` pipelined (HTTP/1.1: every request written before the
        first answer is read; the gateway answers in order); each answer or its failure. A
        connection lost before any answer is tried once more on a new one."""
        wire = b"".join(
            b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), self.host.encode(), self.port, len(payload), payload)
            for payload in (json.dumps(body).encode() for body in bodies))
        out: list[dict[str, Any] | Exception] = []
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._pipe is None:
                        self._pipe = _Pipe(socket.create_connection((self.host, self.port), timeout=self.timeout))
                    self._pipe.sock.sendall(wire)
                    while len(out) < len(bodies):
                        out.append(self._pipe.answer(path))
                    return out
                except (ConnectionError, http.client.HTTPException, OSError) as exc:
                    self._close_pipe()
                    if attempt or out:
                        return out + [exc] * (len(bodies) - len(out))
        return out

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            self._pipe.sock.close()
            self._pipe = None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._close_pipe()


class _Unclosed:
    """The pipelined connection's one buffered reader, lent to each response in turn:
    ``http.client`` closes the reader it is given once a response is read."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def close(self) -> None:
        pass


class _Pipe:
    """A connection for pipelined requests: answers are parsed by ``http.client`` from one
    reader, so bytes of the next answer read ahead are not lost."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = _Unclosed(sock.makefile("rb"))

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> Any:
        return self.reader

    def answer(self, path: str) -> dict[str, Any] | Exception:
        resp = http.client.HTTPResponse(self, method="POST")  # type: ignore[arg-type]
        resp.begin()
        data = resp.read()
        if resp.status != 200:
            return EtcdError(f"etcd {path}: HTTP {resp.status} {data[:200]!r}")
        out: dict[str, Any] = json.loads(data)
        return out


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
        body = self._body(record)
        while True:
            try:
                n = length_of(if_match) if if_match is not None else length_of(self.read(1 << 62).etag)
                if n >= 10 ** 20:
                    raise PreconditionFailed(f"log never had {if_match} records")
            except PreconditionFailed:
                self._raise_if_fenced(record)  # a fence answers first, whatever the tag
                raise
            tag = self._answer(self._etcd.call("/v3/kv/txn", self._txn(record, body, n)), record, n, if_match)
            if tag is not None:
                return tag
            # Unconditional append lost a race: take the new head and try again.

    def _body(self, record: LogRecord) -> bytes:
        body = encode_record(record)
        if len(body) > MAX_RECORD:
            raise RecordTooLarge(f"record of {len(body)} bytes; an etcd log holds records up to {MAX_RECORD}",
                                 extra={"limit": MAX_RECORD})
        return body

    def _txn(self, record: LogRecord, body: bytes, n: int) -> dict[str, Any]:
        """The transaction appending ``body`` as record ``n``: only if the head is still ``n``
        and no fence is above the record's epoch."""
        puts = [{"request_put": {"key": _b64(self._rec + _pad(n)), "value": _b64(body)}},
                {"request_put": {"key": _b64(self._head), "value": _b64(_pad(n + 1))}}]
        if isinstance(record, FenceRecord):
            puts.append({"request_put": {"key": _b64(self._fence), "value": _b64(_pad(record.epoch))}})
        return {
            "compare": [
                {"key": _b64(self._head), "target": "VALUE", "result": "EQUAL", "value": _b64(_pad(n))},
                {"key": _b64(self._fence), "target": "VALUE", "result": "LESS",
                 "value": _b64(_pad(record.epoch + 1))},
            ],
            "success": puts,
            "failure": [self._range_op(self._head), self._range_op(self._fence)],
        }

    def _answer(self, out: dict[str, Any], record: LogRecord, n: int, if_match: str | None) -> str | None:
        """The new tag from :meth:`_txn`'s answer; raises Fenced or PreconditionFailed; None
        when an unconditional append lost a race."""
        if out.get("succeeded"):
            return etag_of(n + 1)
        head_resp, fence_resp = out["responses"]
        fence = int(_value(_kvs(fence_resp)[0]))
        if fence > record.epoch:
            raise fence_error(fence, record)
        if if_match is not None:
            length = int(_value(_kvs(head_resp)[0]))
            raise PreconditionFailed(f"log has {length} records, not {if_match}")
        return None

    def _raise_if_fenced(self, record: LogRecord) -> None:
        out = self._etcd.call("/v3/kv/txn", {"success": [self._range_op(self._fence)]})
        fence = int(_value(_kvs(out["responses"][0])[0]))
        if fence > record.epoch:
            raise fence_error(fence, record)

    def close(self) -> None:
        self._etcd.close()


def append_many(entries: Sequence[tuple[EtcdCommitLog, LogRecord, str | None]]) -> list[str | Exception]:
    """Group commit on etcd: each ``(log, record, if_match)`` answered on its own, as
    ``log.append`` would (the new tag, or its exception).

    The conditional appends to logs on one etcd server go first as combined transactions
    (up to ``TXN_ENTRIES`` entries on distinct logs each: every entry's compares and puts in
    one transaction, one raft entry for all of them), pipelined on one connection. A combined
    transaction that fails (one entry's fence or tag) wrote nothing: its entries are then sent
    as a transaction each, again pipelined, and each is answered by its own. An unconditional
    append or a tag that is not one of a log's goes through ``log.append``."""
    results: list[str | Exception] = [ValueError("not appended")] * len(entries)
    conditional: dict[tuple[str, int], list[tuple[int, bytes, int]]] = {}
    for i, (log, record, if_match) in enumerate(entries):
        try:
            body = log._body(record)
            n = length_of(if_match) if if_match is not None else -1
        except RecordTooLarge as exc:
            results[i] = exc
            continue
        except PreconditionFailed:
            n = -1
        if 0 <= n < 10 ** 20:
            conditional.setdefault((log._etcd.host, log._etcd.port), []).append((i, body, n))
            continue
        try:
            results[i] = log.append(record, if_match)
        except Exception as exc:
            results[i] = exc
    for group in conditional.values():
        gateway = entries[group[0][0]][0]._etcd
        alone = _combined(entries, group, gateway, results)
        if not alone:
            continue
        answers = gateway.call_many("/v3/kv/txn", [entries[i][0]._txn(entries[i][1], body, n) for i, body, n in alone])
        for (i, _, n), out in zip(alone, answers, strict=True):
            log, record, if_match = entries[i]
            try:
                if isinstance(out, Exception):
                    raise out
                tag = log._answer(out, record, n, if_match)
                assert tag is not None  # a conditional append never retries
                results[i] = tag
            except Exception as exc:
                results[i] = exc
    return results


# etcd refuses a transaction of more than --max-txn-ops (128 by default) compares or puts; an
# entry takes two compares and two or three puts.
TXN_ENTRIES = 40


def _combined(entries: Sequence[tuple[EtcdCommitLog, LogRecord, str | None]], group: list[tuple[int, bytes, int]],
              gateway: EtcdGateway, results: list[str | Exception]) -> list[tuple[int, bytes, int]]:
    """``group``'s entries in combined transactions; their tags set in ``results`` where one
    succeeded. Returns the entries still to append alone (a failed combination, or a log met
    twice in the group: one transaction may not put one key twice)."""
    chunks: list[list[tuple[int, bytes, int]]] = [[]]
    seen: set[str] = set()
    for entry in group:
        prefix = entries[entry[0]][0].prefix
        if prefix in seen:
            continue  # alone, after the combined transactions (so after the log's earlier entry)
        seen.add(prefix)
        if len(chunks[-1]) >= TXN_ENTRIES:
            chunks.append([])
        chunks[-1].append(entry)
    chunks = [chunk for chunk in chunks if len(chunk) > 1]  # a single entry is sent alone anyway
    combined = {i for chunk in chunks for i, _, _ in chunk}
    alone = [entry for entry in group if entry[0] not in combined]
    txns = []
    for chunk in chunks:
        parts = [entries[i][0]._txn(entries[i][1], body, n) for i, body, n in chunk]
        txns.append({"compare": [c for part in parts for c in part["compare"]],
                     "success": [p for part in parts for p in part["success"]]})
    for chunk, out in zip(chunks, gateway.call_many("/v3/kv/txn", txns) if txns else [], strict=True):
        if isinstance(out, dict) and out.get("succeeded"):
            for i, _, n in chunk:
                results[i] = etag_of(n + 1)
        else:  # nothing of it was written: each entry on its own says why
            alone.extend(chunk)
    alone.sort()
    return alone
