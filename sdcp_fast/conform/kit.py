"""``sdcp-fast conform URL``: a black-box client that checks an SDCP verifier against the draft.

It speaks only the draft's messages, with two identities from the deployment's CA: a
**router** (it opens sessions, names the drafter, re-opens at a new epoch, §6.1, §6.9) and a
**drafter** (it proposes, §6.2). It knows nothing of the target model, and learns what it
needs from the verifier itself: a first rule-1 session commits greedy decoding whatever is
proposed (§6.4), so its output is the greedy continuation of the kit's prompt, and every later
rule-1 verdict on that prompt is predicted exactly (accepted, emitted, n, d[n]), as is every
ladder action, low counter and reduced m_cap (§6.5.2, :mod:`sdcp_fast.conform.ladder`).

What the draft leaves to the deployment (the cache serving q rows and committed tokens, the
commit log's store) comes from a :mod:`~sdcp_fast.conform.adapters` store; without one those
checks are *not reachable*. Each check records its outcome in a
:class:`~sdcp_fast.conform.report.Report` under its id in
:data:`~sdcp_fast.conform.statements.CHECKS`.
"""

from __future__ import annotations

from sdcp_fast.conform import checks_contracts, checks_ladder, checks_recovery, checks_rounds, checks_rule2
from sdcp_fast.conform.checker import PROMPT, Checker, ConformError
from sdcp_fast.conform.client import Answer, Identities
from sdcp_fast.conform.report import Outcome, Report

GROUPS = ("transport", "auth", "contracts", "session", "rule1", "refusals", "ladder", "rule2", "recovery")
STEPS = {
    "transport": checks_contracts.transport, "auth": checks_contracts.authentication,
    "contracts": checks_contracts.contracts, "session": checks_rounds.session_creation,
    "rule1": checks_rounds.rule1, "refusals": checks_rounds.refusals, "ladder": checks_ladder.ladder,
    "rule2": checks_rule2.rule2, "recovery": checks_recovery.recovery,
}


class Conform(Checker):
    """The kit: the checks of :mod:`~sdcp_fast.conform.checker`'s :class:`Checker`, run in groups."""

    async def run(self, groups: tuple[str, ...] = GROUPS) -> Report:
        r = self.report
        for group in groups:
            needs_session = group not in ("transport", "auth", "contracts")
            if needs_session and self.target_digest is None:
                r.add("open-state", None, "give --target-digest: every check that needs a session")
                continue
            try:
                await STEPS[group](self)
            except ConformError as exc:
                # One group's trouble does not hide the others: each opens sessions of its own.
                r.add("open-state", Outcome.FAIL, f"{group}: the checks could not go on: {exc}")
        return r


__all__ = ["Answer", "Conform", "ConformError", "GROUPS", "Identities", "PROMPT"]
