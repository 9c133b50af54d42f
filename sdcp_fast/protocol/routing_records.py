"""Routing records (docs/interpretations.md, "Routing records"; draft §1.4, §6.1, §6.6, §6.9):
what a router keeps in the MLC about each session so that a restarted router, or another one
sharing the records, takes it over. Pure: the format, the routed session an adopter rebuilds
from it, and the adoption decision; roles/router_records.py reads and writes them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from sdcp_fast.protocol.messages import Policy, Sampling, SessionOpen
from sdcp_fast.protocol.problems import SdcpProblem
from sdcp_fast.protocol.routing import RoutedSession

RECORD_FORMAT = "sdcp-fast-routing/1"
INDEX_FORMAT = "sdcp-fast-routing-index/1"


@dataclass(frozen=True)
class RoutingRecord:
    """What a router must know to take over a session another router (or its own earlier
    process) opened: the session-open its verifier holds (contract, prompt, commit log,
    epoch, resume), the verifier and drafter of record, the writer of each epoch's
    committed_tokens, every sampling update, the client's request, and who routes it now."""

    router: str
    opened: SessionOpen
    verifier: str
    drafter: str | None
    m_init: int
    writers: dict[int, str]
    policies: tuple[Policy, ...] = ()
    sampling: Sampling | None = None
    committed_tokens: str | None = None
    done: bool = False
    request: dict[str, object] | None = None  # the client's request body (JSON), for a resume to match

    @property
    def session(self) -> bytes:
        return self.opened.session

    @property
    def epoch(self) -> int:
        return self.opened.epoch


def record_of(routed: RoutedSession, *, router: str, opened: SessionOpen, writers: dict[int, str],
              request: dict[str, object] | None = None) -> RoutingRecord:
    return RoutingRecord(router=router, opened=opened, verifier=routed.verifier, drafter=routed.drafter,
                         m_init=routed.m_init, writers=dict(writers), policies=tuple(routed.policies),
                         sampling=routed.sampling, committed_tokens=routed.committed_tokens, done=routed.done,
                         request=request)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("expected base64url text")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_record(record: RoutingRecord) -> bytes:
    """The record as the MLC holds it: JSON, its SDCP messages as base64url CBOR."""
    body = {
        "format": RECORD_FORMAT, "session": record.session.hex(), "router": record.router,
        "epoch": record.epoch, "verifier": record.verifier, "drafter": record.drafter, "m_init": record.m_init,
        "open": _b64(record.opened.encode()), "writers": {str(e): w for e, w in sorted(record.writers.items())},
        "policies": [_b64(p.encode()) for p in record.policies],
        "sampling": None if record.sampling is None else _b64(record.sampling.encode()),
        "committed_tokens": record.committed_tokens, "done": record.done, "request": record.request,
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode_record(data: bytes) -> RoutingRecord:
    """The record in ``data``; ValueError for anything that is not one of this format
    (another version, a foreign object, a truncated write)."""
    try:
        body = json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record")
    try:
        opened = SessionOpen.decode(_unb64(body["open"]))
        writers = {int(e): str(w) for e, w in body["writers"].items()}
        policies = tuple(Policy.decode(_unb64(p)) for p in body["policies"])
        sampling = None if body["sampling"] is None else Sampling.decode(_unb64(body["sampling"]))
        record = RoutingRecord(
            router=_text(body["router"]), opened=opened, verifier=_text(body["verifier"]),
            drafter=None if body["drafter"] is None else _text(body["drafter"]), m_init=int(body["m_init"]),
            writers=writers, policies=policies, sampling=sampling,
            committed_tokens=None if body["committed_tokens"] is None else _text(body["committed_tokens"]),
            done=body["done"] is True, request=body["request"] if isinstance(body["request"], dict) else None)
    except (KeyError, TypeError, AttributeError, ValueError, SdcpProblem) as exc:
        raise ValueError(f"malformed {RECORD_FORMAT} record: {type(exc).__name__}: {exc}") from None
    if body.get("session") != record.session.hex() or body.get("epoch") != record.epoch:
        raise ValueError("the record's session or epoch disagrees with its session-open")
    return record


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected text")
    return value


def routed_from(record: RoutingRecord) -> RoutedSession:
    """The router's view of an adopted session, before its verifier says where it stands
    (its session-open again, then :meth:`RoutedSession.follow`)."""
    opened = record.opened
    resume = opened.resume
    return RoutedSession(
        session=opened.session, epoch=opened.epoch, contract=opened.contract, prompt=opened.prompt,
        commit_log=opened.commit_log, verifier=record.verifier,
        round=0 if resume is None else resume.round, committed=0 if resume is None else resume.committed,
        digest=bytes(32) if resume is None else resume.digest, m_init=record.m_init, drafter=record.drafter,
        sampling=record.sampling, committed_tokens=record.committed_tokens, done=record.done,
        policies=list(record.policies))


def adoption(record: RoutingRecord, me: str, *, claim: bool) -> str | None:
    """Whether router ``me`` takes the session of ``record``: None if it does; else why not.
    ``claim``: a client asks ``me`` for the session (a resume), so it takes it from whichever
    router held it, a finished one too (for its output only: nothing is left to route).
    Otherwise (a restart reading its own index) only a live session the record still gives
    to ``me`` is taken."""
    if claim:
        return None
    if record.done:
        return "it finished"
    if record.router.rstrip("/") != me.rstrip("/"):
        return f"router {record.router} routes it now"
    return None


def encode_index(router: str, sessions: Iterable[bytes]) -> bytes:
    """The router's index of the sessions it routes (so that it finds them after a restart)."""
    return json.dumps({"format": INDEX_FORMAT, "router": router, "sessions": sorted(s.hex() for s in sessions)},
                      separators=(",", ":")).encode()


def decode_index(data: bytes) -> list[bytes]:
    """The session ids of an index; ValueError for anything else."""
    try:
        body = json.loads(bytes(data))
        if not isinstance(body, dict) or body.get("format") != INDEX_FORMAT:
            raise ValueError(f"not a {INDEX_FORMAT} object")
        sessions = [bytes.fromhex(s) for s in body["sessions"]]
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed routing index: {exc}") from None
    if any(len(s) != 16 for s in sessions):
        raise ValueError("malformed routing index: a session id is not 16 bytes")
    return sessions


def index_id(router: str) -> bytes:
    """The 16-byte name under which ``router`` keeps its index (in the session position of
    an MLC name; no session id is derived this way)."""
    return hashlib.sha256(b"sdcp-fast routing index\x00" + router.rstrip("/").encode()).digest()[:16]
