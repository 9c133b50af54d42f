"""The target's logits, for the checks that need the distribution p itself (§6.4 rule 2 with
a seed, §6.6 a new profile from from_round): an *oracle* is any object with

    logits(context: Sequence[int], proposal: Sequence[int]) -> Sequence[Sequence[float]]

giving the M + 1 rows of logits for the positions after ``context`` (prompt and committed
output) with ``proposal`` appended, as the verifier's scoring pass would (§6.3). The kit applies
the sampling profile to them (§4.1) and the seeded draws (§6.4) itself. ``--oracle
module:factory`` names one; :func:`toy` is sdcp_fast's toy target (``sdcp-fast up --model toy``).
Without an oracle those checks are not reachable.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any


class ScorerOracle:
    """An oracle on an sdcp_fast :class:`~sdcp_fast.model.interfaces.TargetScorer`."""

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer

    def logits(self, context: Sequence[int], proposal: Sequence[int]) -> list[list[float]]:
        from sdcp_fast.model.interfaces import ScoreRequest, per_request

        batch = [ScoreRequest(b"conform-oracle--", list(context), list(proposal))]
        rows = per_request(self.scorer.score(batch), batch)[0]
        return [[float(x) for x in row] for row in rows.tolist()]


def toy() -> ScorerOracle:
    from sdcp_fast.model.toy import ToyTarget

    return ScorerOracle(ToyTarget())


def load_oracle(spec: str) -> Any:
    """``module:factory`` -> ``factory()``."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"--oracle {spec!r}: expected module:factory")
    return getattr(importlib.import_module(module), attr)()


__all__ = ["ScorerOracle", "load_oracle", "toy"]
