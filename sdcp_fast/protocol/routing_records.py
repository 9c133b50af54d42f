"""Routing records (docs/interpretations.md, "Routing records"; draft §1.4, §6.1, §6.6, §6.9):
what a router keeps in the MLC about each session so that a restarted router, or another one
sharing the records, takes it over. Pure: the format (the encoding of
:class:`~sdcp_fast.protocol.routing.RoutedSession`) and the adoption decision;
roles/router_records.py reads and writes them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable

from sdcp_fast.protocol.messages import Policy, Sampling, SessionOpen
from sdcp_fast.protocol.problems import SdcpProblem
from sdcp_fast.protocol.routing import RoutedSession

RECORD_FORMAT = "sdcp-fast-routing/1"
INDEX_FORMAT = "sdcp-fast-routing-index/1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("expected base64url text")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_record(routed: RoutedSession) -> bytes:
    """The session's routing record as the MLC holds it: JSON of the persisted part of
    :class:`RoutedSession`, its SDCP messages as base64url CBOR."""
    body = {
        "format": RECORD_FORMAT, "session": routed.session.hex(), "router": routed.router,
        "epoch": routed.opened.epoch, "verifier": routed.verifier, "drafter": routed.drafter, "m_init": routed.m_init,
        "open": _b64(routed.opened.encode()), "writers": {str(e): w for e, w in sorted(routed.writers.items())},
        "policies": [_b64(p.encode()) for p in routed.policies],
        "sampling": None if routed.sampling is None else _b64(routed.sampling.encode()),
        "committed_tokens": routed.committed_tokens, "done": routed.done, "request": routed.request,
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode_record(data: bytes) -> RoutedSession:
    """The routed session a record in ``data`` holds, before its verifier says where it stands
    (its session-open again, then :meth:`RoutedSession.follow`): at the epoch of the open, and
    at its resume. ValueError for anything that is not a record of this format (another
    version, a foreign object, a truncated write)."""
    try:
        body = json.loads(bytes(data))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record")
    try:
        opened = SessionOpen.decode(_unb64(body["open"]))
        resume = opened.resume
        routed = RoutedSession(
            opened=opened, epoch=opened.epoch, verifier=_text(body["verifier"]), m_init=int(body["m_init"]),
            round=0 if resume is None else resume.round, committed=0 if resume is None else resume.committed,
            digest=bytes(32) if resume is None else resume.digest,
            drafter=None if body["drafter"] is None else _text(body["drafter"]), router=_text(body["router"]),
            writers={int(e): str(w) for e, w in body["writers"].items()},
            sampling=None if body["sampling"] is None else Sampling.decode(_unb64(body["sampling"])),
            policies=[Policy.decode(_unb64(p)) for p in body["policies"]],
            committed_tokens=None if body["committed_tokens"] is None else _text(body["committed_tokens"]),
            done=body["done"] is True, request=body["request"] if isinstance(body["request"], dict) else None)
    except (KeyError, TypeError, AttributeError, ValueError, SdcpProblem) as exc:
        raise ValueError(f"malformed {RECORD_FORMAT} record: {type(exc).__name__}: {exc}") from None
    if body.get("session") != routed.session.hex() or body.get("epoch") != routed.epoch:
        raise ValueError("the record's session or epoch disagrees with its session-open")
    return routed


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected text")
    return value


def adoption(record: RoutedSession, me: str, *, claim: bool) -> str | None:
    """Whether router ``me`` takes the session of ``record`` (as decoded): None if it does; else why not.
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
