"""The thread that runs the MLC's group commits (``POST /logs``).

A group append is decoded, checked, written and flushed off the event loop. One thread of its
own does it, fed through a queue: a request costs the loop a queue put and, once flushed, one
callback, with no executor work item and no chained futures. Requests that arrive while the
thread flushes are taken together when it is done: their entries are written and flushed as
one group (:meth:`~sdcp_fast.commitlog.directory.LogDirectory.append_many`, one flush for all),
and each request is answered with its own entries' results. No request is answered before its
records are durable.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import weakref
from typing import Any

from sdcp_fast.cache import policy
from sdcp_fast.cache.uri import SCHEME, served_name
from sdcp_fast.commitlog.directory import LogDirectory
from sdcp_fast.mlc_server.records import decode_to_store
from sdcp_fast.mlc_server.server_requests import batch_answer, batch_appends
from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import LogRecord
from sdcp_fast.protocol.peer import Peer

# (body, peer, future of the reply body, its loop); None stops the thread.
_Job = tuple[bytes | bytearray, Peer | None, "asyncio.Future[bytes]", asyncio.AbstractEventLoop]


class Committer:
    """Group appends to ``logs``, run on one thread started at the first one and stopped by
    :meth:`close` (or when this object is collected)."""

    def __init__(self, logs: LogDirectory) -> None:
        self.logs = logs
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def submit(self, body: bytes | bytearray, peer: Peer | None) -> asyncio.Future[bytes]:
        """The reply body of the group append ``body`` (a ``POST /logs`` body) from ``peer``,
        or its whole-request problem (BadRequest, TooManyAppends), as a future of the running
        loop. ``body`` is read on the thread: the caller keeps it until the future is done."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        if self._thread is None:
            self._started()
        self._queue.put((body, peer, future, loop))
        return future

    def _started(self) -> None:
        with self._start:
            if self._thread is None:
                thread = threading.Thread(target=_run, args=(self._queue, self.logs), name="mlc-commit", daemon=True)
                thread.start()
                weakref.finalize(self, self._queue.put, None)
                self._thread = thread

    def close(self) -> None:
        """Stop the thread once the requests queued before are answered."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


@functools.lru_cache(maxsize=4096)
def log_uri(name: str) -> str:
    """The URI of the log ``name`` names (ValueError for a name no log may have): a group commit
    names the same open sessions' logs pass after pass, so each name is checked once, not per record."""
    uri = SCHEME + name
    served_name(uri, log=True)
    return uri


def _run(jobs: queue.SimpleQueue[_Job | None], logs: LogDirectory) -> None:
    while True:
        first = jobs.get()
        if first is None:
            return
        group, stop = [first], False
        while not jobs.empty():  # every request queued meanwhile goes into this flush
            job = jobs.get()  # this thread is the only reader: it is there
            if job is None:
                stop = True
                break
            group.append(job)
        _commit(logs, group)
        if stop:
            return


def _commit(logs: LogDirectory, group: list[_Job]) -> None:
    """Each request of ``group`` decoded and checked, all their entries appended with one
    flush, and each request answered on its own loop."""
    todo: list[tuple[str, LogRecord, str | None]] = []
    stored: list[bytes | None] = []
    # Per request: its entries' results, and where each entry it sent to the logs sits in todo.
    plans: list[tuple[list[str | Exception], list[tuple[int, int]]] | BaseException] = []
    for body, peer, _, _ in group:
        try:
            entries = batch_appends(cbor.decode(bytes(body)))
        except Exception as exc:  # the whole request is refused (400, 413)
            plans.append(exc)
            continue
        results: list[str | Exception] = [ValueError("not appended")] * len(entries)
        where: list[tuple[int, int]] = []
        for i, (name, raw, if_match) in enumerate(entries):
            try:
                uri = log_uri(name)
                record, encoded = decode_to_store(raw)
                policy.may_append(peer, record)
            except Exception as exc:
                results[i] = exc
                continue
            where.append((i, len(todo)))
            todo.append((uri, record, if_match))
            stored.append(encoded)
        plans.append((results, where))
    failed: Exception | None = None
    try:
        appended: list[str | Exception] = logs.append_many(todo, stored) if todo else []
    except Exception as exc:  # a bug: each request that sent an entry gets it as its problem
        failed, appended = exc, []
    for (_, _, future, loop), plan in zip(group, plans, strict=True):
        answer: Any
        if isinstance(plan, BaseException):
            answer = plan
        elif failed is not None and plan[1]:
            answer = failed
        else:
            results, where = plan
            for i, at in where:
                results[i] = appended[at]
            try:
                answer = batch_answer(results)
            except Exception as exc:
                answer = exc
        try:
            loop.call_soon_threadsafe(_settle, future, answer)
        except RuntimeError:
            pass  # its loop is closed: nobody waits for the answer


def _settle(future: asyncio.Future[bytes], answer: bytes | BaseException) -> None:
    if future.done():  # cancelled: its client is gone
        return
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)
