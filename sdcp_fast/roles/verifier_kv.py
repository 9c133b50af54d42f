"""The verifier's target KV pages (§6.3 "MAY publish", §6.9 ``resume.target_kv``): published
in the background after commits, imported when a resumed session names them.

With a scorer that keeps a paged cache, the committed prefix's KV is published to
``target_kv/<epoch>.<writer tag>`` whenever it has grown enough since the last publish; a resumed open
whose ``resume.target_kv`` names such an object imports it, so its first pass computes only
the positions after it (docs/reliability.md, scenario 2).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sdcp_fast.cache import object_uri
from sdcp_fast.cache.uri import parse, writer_tag
from sdcp_fast.model.interfaces import TargetKV
from sdcp_fast.protocol.session import State, VerifierSession
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.verifier_config import VerifierConfig, VerifierContext
from sdcp_fast.roles.verifier_state import LiveSession

log = logging.getLogger("sdcp_fast.verifier")


def kv_object(session: VerifierSession, writer: str = "") -> str | None:
    """Where this verifier publishes the session's target KV pages: one object per epoch, as
    for ``committed_tokens`` (a fenced verifier's late publish replaces only its own), named
    for ``writer`` (this verifier's base URI: its tag), so no other verifier can create it
    first (docs/security.md, "Names nobody can squat"). None without a scope or a writer: an
    untagged name is anybody's to take."""
    if session.contract.scope is None or not writer:
        return None
    return object_uri(session.contract.scope, session.session, "target_kv", session.epoch, tag=writer_tag(writer))


def untagged(ref: str) -> bool:
    """Whether ``ref`` names pages without their writer's tag: whoever created them first
    owns such a name, so nothing says they are the session's verifier's."""
    try:
        return parse(ref).tag is None
    except ValueError:
        return True


class KvPublisher:
    """Publishes and imports one verifier's target KV pages. ``objects`` runs calls where
    scoring runs (the copy out of the cache, an import); encoding and storing pages run on a
    thread of their own, never in the way of a pass, a verdict or an append."""

    def __init__(self, target_kv: TargetKV | None, config: VerifierConfig, context: VerifierContext) -> None:
        self.target_kv = target_kv
        self.objects = context.objects
        self.metrics = context.metrics
        self.background = context.background
        # A publish whenever the published prefix would grow by max(tokens, growth x published):
        # bytes written stay within 1 / growth + 1 times the final object's (a geometric series)
        # while a fail-over recomputes at most about growth x n + tokens positions.
        self.publish_tokens = config.kv_publish_tokens
        self.publish_growth = config.kv_publish_growth
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="verifier-kv") if target_kv is not None else None
        self._own = Objects(context.store, self._executor)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def resume(self, live: LiveSession, ref: str | None) -> None:
        """Import the pages a resume names, before any pass of the session; whatever goes wrong
        (none named, unreadable, another model's, other tokens) leaves a cold prefill to the
        first pass, which is always correct, and is counted by reason."""
        session = live.session
        kv = self.target_kv
        if kv is None:
            self.metrics.resume("cold", "unsupported")
            return
        if ref is None:
            self.metrics.resume("cold", "none")
            return
        if untagged(ref):
            log.warning("session %s: target KV %s refused: its name carries no writer's tag", session.session.hex(), ref)
            self.metrics.resume("cold", "refused")
            return
        committed = (*session.prompt, *session.output(0).tokens)

        def load(data: Any) -> int:  # parsing is cheap (the values are not copied): one hop, not two
            return kv.import_kv(session.session, kv.decode_kv(data), committed)

        try:
            # On the time to first token: where scoring runs, not on the publishing thread.
            n = int(await self.objects.call(load, await self.objects.get(ref)))
        except ValueError as exc:
            log.warning("session %s: target KV %s refused: %s", session.session.hex(), ref, exc)
            self.metrics.resume("cold", "refused")
            return
        except Exception as exc:  # missing, evicted, the MLC unreachable: compute instead
            log.warning("session %s: target KV %s unavailable: %s", session.session.hex(), ref, exc)
            self.metrics.resume("cold", "unavailable")
            return
        live.prefill.fed = n  # the first pass, or prefill chunks, compute only what follows
        self.metrics.resume("pages" if n else "cold", "" if n else "refused", positions=n)

    def after_commit(self, live: LiveSession) -> None:
        """Publish if the committed prefix grew enough; drop the pages of an ended session."""
        session = live.session
        pages = live.kv
        if self.target_kv is None or pages.ref is None or pages.busy:
            return
        if session.state in (State.FINISHED, State.FAILED):
            # Nobody resumes an ended session: its pages only take room in the MLC. (A fenced
            # one's stay: if its successor dies before publishing, the next resume uses them.)
            if pages.published:
                pages.published = 0
                self.background.spawn(self._drop(pages.ref))
            return
        if session.closed:
            return
        grown = len(session.prompt) + session.committed - pages.published
        if grown < max(self.publish_tokens, int(pages.published * self.publish_growth)):
            return
        pages.busy = True
        self.background.spawn(self._publish(live))

    async def _publish(self, live: LiveSession) -> None:
        """Copy the committed prefix out of the cache (between passes), encode and store it
        (off the event loop and the scoring thread). A failure is logged and counted: a later
        fail-over then recomputes more, nothing else changes."""
        kv, ref = self.target_kv, live.kv.ref
        assert kv is not None and ref is not None
        session = live.session
        done = False
        try:
            committed = (*session.prompt, *session.output(0).tokens)
            pages = await self.objects.call(kv.export_kv, session.session, committed)
            if pages is None:
                return
            data = await self._own.call(kv.encode_kv, pages)
            await self._own.put(ref, data)
            live.kv.published = len(committed)
            self.metrics.kv_published(len(data))
            done = True
        except Exception as exc:
            log.warning("session %s: target KV not published to %s: %s", session.session.hex(), ref, exc)
            self.metrics.kv_publish_failed()
        finally:
            live.kv.busy = False
        if done:  # rounds committed meanwhile were skipped (one publish at a time): catch up now
            self.after_commit(live)

    async def _drop(self, ref: str) -> None:
        try:
            await self._own.delete(ref)
        except Exception as exc:  # evicted already, or the MLC away: LRU reclaims it in time
            log.info("target KV %s not deleted: %s", ref, exc)
