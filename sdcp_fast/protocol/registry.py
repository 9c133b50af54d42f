"""The verifier's sessions by id (draft §6.1 POST sessions, §6.9 re-open at a new epoch), sans I/O.

``POST sessions`` is idempotent: a session-open the verifier already holds (same id, epoch
and message) answers the session's current state and changes nothing, so a router that
lost the answer may send it again. A higher epoch is a fail-over back onto this verifier
(§6.9): a new session at that epoch replaces the old one, which is superseded (every later
input to it answers ``sdcp-stale-epoch``). A lower epoch is ``sdcp-stale-epoch``; the same
epoch with a different message is ``sdcp-bad-request`` (docs/interpretations.md).

An adapter keeps its own record of a session (its commit log, who waits on it) attached to
the session here, so that one table says which sessions exist: a session replaced by a
higher epoch or removed takes its record with it, and a session whose open the adapter has
not completed yet has none.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sdcp_fast.protocol.messages import SessionOpen, SessionState
from sdcp_fast.protocol.problems import BadRequest, StaleEpoch, UnknownSession
from sdcp_fast.protocol.session import State, VerifierSession

T = TypeVar("T")


@dataclass
class _Held(Generic[T]):
    message: SessionOpen
    session: VerifierSession
    attached: T | None = None


class SessionRegistry(Generic[T]):
    """Every session open at one verifier, keyed by the 16-byte session id, each with the
    adapter's record of type ``T`` once attached."""

    def __init__(self) -> None:
        self._held: dict[bytes, _Held[T]] = {}
        # The held sessions not yet found closed (a closed session never opens again: a re-open
        # is a new session), so that the scans made per scoring pass walk the open sessions,
        # not also the ended ones kept for their readers (hundreds, on a busy verifier).
        self._open: dict[bytes, _Held[T]] = {}

    def open(
        self,
        message: SessionOpen,
        *,
        target_digest: bytes,
        vocab: int | None = None,
        prompt_tokens: Sequence[int] | None = None,
        committed_tokens: Sequence[int] = (),
    ) -> tuple[VerifierSession, SessionState]:
        """``POST sessions``: the session and the session-state to answer.

        The keyword arguments are :meth:`VerifierSession.open`'s. A session-open that would
        replace a held session is validated in full before the old one is superseded.
        """
        held = self._held.get(message.session)
        if held is not None:
            current = held.session
            if message.epoch < current.epoch:
                raise StaleEpoch(f"session-open epoch {message.epoch}, session epoch {current.epoch}",
                                 extra={"session_state": current.session_state().to_map()})
            if message.epoch == current.epoch:
                if message != held.message:
                    raise BadRequest("a different session-open for a session open at this epoch",
                                     extra={"session_state": current.session_state().to_map()})
                if current.state is State.FENCED:
                    raise StaleEpoch("this verifier's epoch was fenced; the session moved")
                return current, current.session_state()
        session, state = VerifierSession.open(
            message, target_digest=target_digest, vocab=vocab, prompt_tokens=prompt_tokens,
            committed_tokens=committed_tokens)
        if held is not None:
            held.session.supersede()
        self._open.pop(message.session, None)  # a re-opened session: last in the open order
        self._held[message.session] = self._open[message.session] = _Held(message, session)
        return session, state

    def attach(self, session: VerifierSession, record: T | None) -> None:
        """Keep ``record`` beside ``session`` (None: take it away again), as long as the
        session is the one held under its id; :class:`UnknownSession` if it is not."""
        held = self._held.get(session.session)
        if held is None or held.session is not session:
            raise UnknownSession(f"no session {bytes(session.session).hex()} at this verifier")
        held.attached = record

    def attached(self, session: bytes) -> T | None:
        """The record attached to the session held under ``session``; None if there is no such
        session or nothing is attached to it yet."""
        held = self._held.get(session)
        return None if held is None else held.attached

    def records(self) -> list[T]:
        """Every attached record, one per session id."""
        return [held.attached for held in self._held.values() if held.attached is not None]

    def open_records(self) -> list[T]:
        """The attached records of the sessions not closed (finished, failed or fenced), in the
        order the sessions were last opened."""
        out: list[T] = []
        closed: list[bytes] = []
        for key, held in self._open.items():
            if held.session.closed:
                closed.append(key)
            elif held.attached is not None:
                out.append(held.attached)
        for key in closed:
            del self._open[key]
        return out

    def get(self, session: bytes) -> VerifierSession:
        """The session with id ``session``; :class:`UnknownSession` (404) if none is open here."""
        held = self._held.get(session)
        if held is None:
            raise UnknownSession(f"no session {bytes(session).hex()} at this verifier")
        return held.session

    def remove(self, session: bytes) -> VerifierSession:
        """Forget a session (finished and delivered, or moved away); :class:`UnknownSession`
        if none is held. A removed session may be opened again from epoch 1 on."""
        held = self._held.pop(session, None)
        self._open.pop(session, None)
        if held is None:
            raise UnknownSession(f"no session {bytes(session).hex()} at this verifier")
        return held.session

    def __contains__(self, session: object) -> bool:
        return session in self._held

    def __iter__(self) -> Iterator[VerifierSession]:
        """The sessions held, in the order they were (last) opened."""
        return iter([held.session for held in self._held.values()])

    def __len__(self) -> int:
        return len(self._held)
