"""Opening a session at the verifier (§6.1 ``POST sessions``, §6.9 a resume): what the open
reads (the prompt a cache-ref names, the resumed prefix) and what it sets up before it
returns (the session's log, its output object, its imported target KV pages).
"""

from __future__ import annotations

from collections.abc import Sequence

from sdcp_fast.cache import ObjectUnavailable
from sdcp_fast.protocol import BadRequest, SessionOpen, StaleEpoch
from sdcp_fast.protocol.registry import SessionRegistry
from sdcp_fast.protocol.session import VerifierSession
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.verifier_commit import Committer
from sdcp_fast.roles.verifier_kv import KvPublisher
from sdcp_fast.roles.verifier_state import LiveSession


async def open_objects(message: SessionOpen, objects: Objects,
                       committer: Committer) -> tuple[tuple[int, ...] | None, Sequence[int]]:
    """The prompt a cache-ref names, and the output a resume names."""
    prompt = None
    committed: Sequence[int] = ()
    try:
        if isinstance(message.prompt, str):
            prompt = await objects.tokens(message.prompt)
        if message.resume is not None:
            # The log holds every emitted token; the object only what its writer last put
            # there (roles/verifier_commit.py). The resumed prefix is what the last commit
            # record names, from the log where it holds it; the core checks its digest.
            resumed = message.resume.committed
            committed = await committer.output_in_log(message.commit_log)
            if len(committed) < resumed:
                committed = await objects.tokens(message.resume.committed_tokens)
            committed = committed[:resumed]
    except ObjectUnavailable as exc:
        raise BadRequest(f"a referenced object could not be read: {exc}") from None
    return prompt, committed


async def serve(sessions: SessionRegistry[LiveSession], session: VerifierSession, message: SessionOpen, *,
                committer: Committer, kv: KvPublisher) -> None:
    """Open the session's log and serve it from now on: the router names this verifier
    before the open returns, and an output reader must not find the session unknown (it
    would fail it over again). No round is scored before the open returns: nobody is
    assigned to it yet."""
    try:
        live = await committer.open(session, message.commit_log)
    except ValueError as exc:  # a name no backend serves: the router's mistake, not ours
        raise BadRequest(f"commit_log cannot be opened: {exc}") from None
    except StaleEpoch:  # its log moved past this open (a restart, a fence): not held here
        if session.session in sessions and sessions.get(session.session) is session:
            sessions.remove(session.session)
        raise
    if sessions.get(session.session) is not session:
        raise StaleEpoch("the session was re-opened at a newer epoch")
    sessions.attach(session, live)
    if live.log.tokens_ref is not None and session.committed:
        try:
            # A resumed session's output, in this epoch's object before anyone is assigned to it.
            await committer.write_output(live, session.output(0).tokens)
        except BaseException:  # not opened after all: the router's retry writes it again
            if sessions.attached(session.session) is live:
                sessions.attach(session, None)
            raise
    if message.resume is not None:
        await kv.resume(live, message.resume.target_kv)
