"""A commit log on an ``sdcp-fast mlc`` server: ``GET /logs/<name>?from=n`` and ``POST``
with ``If-Match``, over the project's transport (HTTP/2 with mutual TLS by default).

:class:`AsyncHttpCommitLog` awaits each call on a :class:`~sdcp_fast.transport.base.Transport`
(the roles share one with their MLC client); :class:`HttpCommitLog` is the same log for
blocking callers, run on an event loop of its own in a background thread.

:func:`append_batch` sends appends to several logs of one server as one request (``POST
/logs``, group commit), each entry answered on its own.

The server's answers map to the backend contract of :mod:`sdcp_fast.commitlog.backend`: 412 is
``PreconditionFailed``, 409 ``sdcp-stale-epoch`` is ``Fenced``, 413 ``RecordTooLarge``; a log
nobody appended to yet (404 ``mlc-unknown-log``) reads as empty with tag ``"0"``. No answer at
all is a ConnectionError.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Coroutine, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote, unquote, urlsplit

from sdcp_fast.commitlog.backend import (
    Fenced,
    LogCorrupt,
    LogFull,
    LogView,
    PreconditionFailed,
    RecordTooLarge,
    UnknownLog,
    etag_of,
)
from sdcp_fast.commitlog.file import MAX_RECORD
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import LogRecord, decode_log, encode_record
from sdcp_fast.protocol.problems import SdcpProblem, StaleEpoch
from sdcp_fast.transport import http_transport
from sdcp_fast.transport.base import Response, Transport
from sdcp_fast.transport.errors import TransportError
from sdcp_fast.transport.loop import LoopThread
from sdcp_fast.transport.problem import problem_in, problem_of

T = TypeVar("T")

_OURS: dict[str, type[SdcpProblem]] = {
    cls.suffix: cls for cls in (PreconditionFailed, RecordTooLarge, UnknownLog, LogCorrupt, LogFull)
}
_OURS[StaleEpoch.suffix] = Fenced
# Whatever the body says, these statuses mean only this on a log.
_BY_STATUS: dict[int, type[SdcpProblem]] = {412: PreconditionFailed, 413: RecordTooLarge}


# One POST /logs carries at most this many appends, and records of at most MAX_RECORD bytes
# in all (the body's limit leaves room for the entries' framing).
MAX_BATCH = 1024
MAX_BATCH_BODY = MAX_RECORD + (1 << 20)


class LogUnreachable(ConnectionError):
    """No answer from the server holding the log (refused, reset, TLS failure, timeout)."""


def _split(ref: str) -> tuple[str, str]:
    """``http(s)://host:port[/root]/logs/<name>`` -> (base URI, path ``logs/<name>`` unquoted)."""
    parts = urlsplit(ref)
    if parts.scheme not in ("http", "https") or not parts.hostname or "/logs/" not in parts.path:
        raise ValueError(f"expected http(s)://host:port/logs/<scope>/<session>/commit_log, got {ref!r}")
    root, _, name = parts.path.partition("/logs/")
    return f"{parts.scheme}://{parts.netloc}{root}/", "logs/" + unquote(name)


def _ref(base_url: str, name: str) -> str:
    if not name.startswith("mlc://"):
        raise ValueError(f"commit logs on an MLC server are named mlc://...: {name!r}")
    return base_url.rstrip("/") + "/logs/" + quote(name[len("mlc://"):], safe="/")


class AsyncHttpCommitLog:
    """``ref`` is ``http(s)://host:port/logs/<scope>/<session>/commit_log``; ``read`` and
    ``append`` are coroutines sent on ``transport``."""

    enforces_fencing: ClassVar[bool] = True  # the server's file log checks the fence with the tag

    def __init__(self, ref: str, transport: Transport, *, timeout: float | None = None) -> None:
        self.ref = ref
        self._base, self._path = _split(ref)
        self.transport = transport
        self.timeout = timeout

    @classmethod
    def on_server(cls, base_url: str, name: str, transport: Transport) -> AsyncHttpCommitLog:
        """The log ``name`` (an ``mlc://`` URI) on the server at ``base_url``."""
        return cls(_ref(base_url, name), transport)

    async def _call(self, method: str, body: bytes = b"", headers: dict[str, str] | None = None,
                    query: dict[str, str] | None = None) -> Response:
        try:
            response = await self.transport.request(self._base, method, self._path, body=body, query=query,
                                                    headers=headers, timeout=self.timeout)
        except TransportError as exc:
            raise LogUnreachable(str(exc)) from exc
        if response.status >= 400:
            raise problem_of(response, _OURS, _BY_STATUS)
        return response

    async def read(self, start: int = 0) -> LogView:
        try:
            response = await self._call("GET", query={"from": str(start)})
        except UnknownLog:
            return LogView([], start, etag_of(0))
        return LogView(decode_log(response.body), start, response.headers["etag"])

    async def append(self, record: LogRecord, if_match: str | None) -> str:
        headers = {"content-type": "application/cbor"}
        if if_match is not None:
            headers["if-match"] = if_match
        return (await self._call("POST", encode_record(record), headers)).headers["etag"]

    async def close(self) -> None:
        pass  # the transport belongs to whoever gave it


async def append_batch(entries: Sequence[tuple[AsyncHttpCommitLog, LogRecord, str | None]]) -> list[str | Exception]:
    """Each ``(log, record, if_match)`` appended as ``log.append`` would, answered on its own
    (the new tag, or the exception that append raises); the logs are on one server, reached
    through the first one's transport: ``POST /logs`` requests of up to ``MAX_BATCH`` entries
    and ``MAX_RECORD`` record bytes each, sent concurrently. A request that gets no answer
    fails each of its entries with LogUnreachable."""
    results: list[str | Exception] = [ValueError("not appended")] * len(entries)
    chunks: list[list[tuple[int, bytes]]] = [[]]
    size = 0
    for i, (_, record, _) in enumerate(entries):
        body = encode_record(record)
        if len(body) > MAX_RECORD:
            results[i] = RecordTooLarge(f"record of {len(body)} bytes; a served log holds records up to "
                                        f"{MAX_RECORD}", extra={"limit": MAX_RECORD})
            continue
        if len(chunks[-1]) >= MAX_BATCH or size + len(body) > MAX_RECORD:
            chunks.append([])
            size = 0
        chunks[-1].append((i, body))
        size += len(body)

    async def send(chunk: list[tuple[int, bytes]]) -> None:
        first = entries[chunk[0][0]][0]
        appends = []
        for i, body in chunk:
            log, _, if_match = entries[i]
            entry: dict[str, Any] = {"log": log._path[len("logs/"):], "record": body}
            if if_match is not None:
                entry["if_match"] = if_match
            appends.append(entry)
        try:
            response = await first.transport.request(
                first._base, "POST", "logs", body=cbor.deterministic_cbor({"appends": appends}),
                headers={"content-type": "application/cbor"}, timeout=first.timeout)
            if response.status >= 400:
                raise problem_of(response, _OURS, _BY_STATUS)
            decoded = cbor.decode(response.body)
            answers = decoded.get("results") if isinstance(decoded, dict) else None
            if not isinstance(answers, list) or len(answers) != len(chunk):
                raise LogUnreachable(f"the batch append's answer holds no result for each of {len(chunk)} appends")
        except TransportError as exc:
            for i, _ in chunk:
                results[i] = LogUnreachable(str(exc))
            return
        except Exception as exc:
            for i, _ in chunk:
                results[i] = exc
            return
        for (i, _), answer in zip(chunk, answers, strict=True):
            results[i] = _entry_result(answer)

    await asyncio.gather(*(send(chunk) for chunk in chunks if chunk))
    return results


def _entry_result(answer: Any) -> str | Exception:
    """One entry of a ``POST /logs`` answer: its new tag, or the exception its problem means."""
    if not isinstance(answer, dict):
        return LogUnreachable("a batch append's result is not a map")
    status, etag = answer.get("status"), answer.get("etag")
    if status == 201 and isinstance(etag, str):
        return etag
    return problem_in(status if isinstance(status, int) else 500, answer, _OURS, _BY_STATUS)


class HttpCommitLog:
    """The blocking form of :class:`AsyncHttpCommitLog`, with a transport of its own
    (``ssl``: a client context offering ALPN h2; none: h2c on loopback; ``http1`` for a
    ``--http1`` server)."""

    enforces_fencing: ClassVar[bool] = True

    def __init__(self, ref: str, *, ssl: ssl.SSLContext | None = None, timeout: float = 30.0,
                 http1: bool = False) -> None:
        _split(ref)
        self.ref = ref
        self._runner = LoopThread("commit-log-client")

        async def make() -> AsyncHttpCommitLog:
            return AsyncHttpCommitLog(ref, http_transport(ssl, http1=http1, timeout=timeout))

        self.aio = self._run(make())

    @classmethod
    def on_server(cls, base_url: str, name: str, *, ssl: ssl.SSLContext | None = None,
                  http1: bool = False) -> HttpCommitLog:
        """The log ``name`` (an ``mlc://`` URI) on the server at ``base_url``."""
        return cls(_ref(base_url, name), ssl=ssl, http1=http1)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def read(self, start: int = 0) -> LogView:
        return self._run(self.aio.read(start))

    def append(self, record: LogRecord, if_match: str | None) -> str:
        return self._run(self.aio.append(record, if_match))

    def close(self) -> None:
        if self._runner.loop.is_closed():
            return
        try:
            self._run(self.aio.transport.close())
        finally:
            self._runner.stop()
