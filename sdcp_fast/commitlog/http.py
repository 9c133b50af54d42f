"""A commit log on an ``sdcp-fast mlc`` server: ``GET /logs/<name>?from=n`` and ``POST``
with ``If-Match``, over HTTP(S) with mutual TLS. One keep-alive connection per thread.

The server's answers map to the backend contract of :mod:`sdcp_fast.commitlog.base`: 412 is
``PreconditionFailed``, 409 ``sdcp-stale-epoch`` is ``Fenced``, 413 ``RecordTooLarge``; a log
nobody appended to yet (404 ``mlc-unknown-log``) reads as empty with tag ``"0"``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

from sdcp_fast.commitlog.base import (
    Fenced,
    LogCorrupt,
    LogView,
    PreconditionFailed,
    RecordTooLarge,
    UnknownLog,
    etag_of,
)
from sdcp_fast.protocol.commitlog import LogRecord, decode_log, encode_record
from sdcp_fast.protocol.problems import SdcpProblem, StaleEpoch, problem_from_response, type_suffix

_OURS: dict[str, type[SdcpProblem]] = {
    cls.suffix: cls for cls in (PreconditionFailed, RecordTooLarge, UnknownLog, LogCorrupt)
}
_OURS[StaleEpoch.suffix] = Fenced


def _problem(status: int, headers: dict[str, str], body: bytes) -> SdcpProblem:
    doc: Any = None
    if headers.get("content-type", "").startswith("application/problem+json"):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
    generic = problem_from_response(status, doc if isinstance(doc, dict) else None)
    cls = _OURS.get(type_suffix(generic.type_uri))
    if cls is None:  # whatever the body says, these statuses mean only this on a log
        cls = {412: PreconditionFailed, 413: RecordTooLarge}.get(status)
    if cls is None:
        return generic
    return cls(generic.detail if generic.detail != generic.title else "", extra=generic.extra)


class HttpCommitLog:
    """``ref`` is ``http(s)://host:port/logs/<scope>/<session>/commit_log``."""

    enforces_fencing: ClassVar[bool] = True  # the server's file log checks the fence with the tag

    def __init__(self, ref: str, *, ssl: ssl.SSLContext | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(ref)
        if parts.scheme not in ("http", "https") or not parts.hostname or "/logs/" not in parts.path:
            raise ValueError(f"expected http(s)://host:port/logs/<scope>/<session>/commit_log, got {ref!r}")
        self.ref = ref
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port or (443 if self._https else 80)
        self._path = parts.path
        self._ssl = ssl
        self._timeout = timeout
        self._local = threading.local()

    @classmethod
    def on_server(cls, base_url: str, name: str, *, ssl: ssl.SSLContext | None = None) -> HttpCommitLog:
        """The log ``name`` (an ``mlc://`` URI) on the server at ``base_url``."""
        if not name.startswith("mlc://"):
            raise ValueError(f"commit logs on an MLC server are named mlc://...: {name!r}")
        return cls(base_url.rstrip("/") + "/logs/" + quote(name[len("mlc://"):], safe="/"), ssl=ssl)

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = (http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout, context=self._ssl)
                        if self._https else http.client.HTTPConnection(self._host, self._port, timeout=self._timeout))
                self._local.conn = conn
            try:
                conn.request(method, path, body=body, headers=headers or {})
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

    def read(self, start: int = 0) -> LogView:
        try:
            _, h, body = self._request("GET", f"{self._path}?from={start}")
        except UnknownLog:
            return LogView([], start, etag_of(0))
        return LogView(decode_log(body), start, h["etag"])

    def append(self, record: LogRecord, if_match: str | None) -> str:
        headers = {"Content-Type": "application/cbor"}
        if if_match is not None:
            headers["If-Match"] = if_match
        _, h, _ = self._request("POST", self._path, encode_record(record), headers)
        return h["etag"]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
