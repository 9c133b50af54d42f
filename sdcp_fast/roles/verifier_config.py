"""What a verifier is built from: one :class:`VerifierConfig` (who it is, its limits, budgets,
timeouts and sizes) and one :class:`VerifierContext` (the parts its parts share). The role
builds the context once; each part takes both and keeps what it needs, so that a new setting
is a field here, not a keyword threaded through every constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sdcp_fast.roles.load import VerifierLoad
from sdcp_fast.roles.metrics import VerifierMetrics
from sdcp_fast.roles.objects import Objects
from sdcp_fast.roles.verifier_state import Background
from sdcp_fast.store.interface import Store


@dataclass(frozen=True, kw_only=True)
class VerifierConfig:
    """A verifier's settings (docs/roles.md; the command line's options map onto them)."""

    uri: str  # its base URI: its tag in the object names it writes
    target_digest: bytes
    router: str | None = None  # whose events and status it sends (comma-separated: each of them)
    backend: str = "auto"  # the kernels' (sdcp_fast.kernels)
    # Bounds a router cannot exceed (docs/security.md, "Limits"): sessions not yet ended (a new
    # one beyond it is 503 sdcp-busy: open it at another verifier) and prompt tokens.
    max_sessions: int = 4096
    max_prompt: int = 1 << 17
    max_batch: int = 64  # rounds in a scoring pass
    batch_wait: float = 0.005  # seconds a batch waits for the sessions that owe a proposal
    output_wait: float = 10.0  # seconds an output long-poll waits for tokens
    status_ttl_ms: int = 10_000
    # Scoring passes off the event loop, so that a service keeps answering while a pass runs;
    # in process they run inline.
    offload: bool = False
    # Local policy (docs/interpretations.md): a session no drafter was assigned to for this
    # many seconds is decoded by the target itself, where its contract permits it.
    self_decode_idle: float | None = None
    # A target KV publish whenever the published prefix would grow by max(tokens, growth x
    # published) (roles/verifier_kv.py).
    kv_publish_tokens: int = 32
    kv_publish_growth: float = 0.25
    # Context tokens a pass feeds beside decoding rounds, and alone (roles/verifier_plan.py);
    # None: the scorer's device's default, 0: a context in one pass.
    prefill_chunk: int | None = None
    prefill_solo: int | None = None


@dataclass(frozen=True)
class VerifierContext:
    """The parts every part of one verifier shares."""

    store: Store
    objects: Objects  # the store, called where scoring runs
    load: VerifierLoad
    metrics: VerifierMetrics
    background: Background  # tasks nobody awaits, cancelled on close
    clock: Callable[[], float]
