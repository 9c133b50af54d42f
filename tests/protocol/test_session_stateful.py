"""Every state of a verifier session x every input: the result is a valid state or an
SdcpProblem, never another exception (h2-style Hypothesis state machine)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.digests import extend_digest, prefix_digest
from sdcp_fast.protocol.messages import Policy, Sampling
from sdcp_fast.protocol.problems import SdcpProblem
from sdcp_fast.protocol.session import TRANSITIONS, Input, RoundDone, ScoreNeeded, State
from tests.protocol.sessionkit import DRAFTER, SID, assignment, contract, open_session, proposal, q_bytes

OTHER = "https://drafter-b.example/"
TOKENS = st.lists(st.integers(0, 5), max_size=5).map(tuple)


class SessionMachine(RuleBasedStateMachine):
    @rule(rule_id=st.sampled_from([1, 2]), seed=st.one_of(st.none(), st.integers(0, 3)),
          low_rounds=st.integers(1, 2), fallback=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=1,
                                                          max_size=4).map(tuple),
          self_load=st.one_of(st.none(), st.integers(0, 100)), self_max=st.one_of(st.none(), st.integers(1, 3)),
          max_new=st.integers(0, 12), m_max=st.integers(1, 4))
    @precondition(lambda self: not hasattr(self, "session"))
    def start(self, rule_id, seed, low_rounds, fallback, self_load, self_max, max_new, m_max):
        c = contract(rule=rule_id, sampling=Sampling(seed=seed), low_rounds=low_rounds, fallback=fallback,
                     self_load=self_load, self_max=self_max, max_new=max_new, m_max=m_max, stop=(5,))
        self.session = open_session(c, drafter=None)
        self.d0 = prefix_digest(contract_digest(c), self.session.prompt)
        self.released = 0
        self._call(self.session.assign, assignment(self.session, m_init=m_max))

    def _call(self, fn, *args, **kwargs):
        before = self.session.state
        try:
            result = fn(*args, **kwargs)
        except SdcpProblem:
            return None
        if isinstance(result, RoundDone):
            assert result.start == self.released
            self.released += len(result.tokens)
        assert self.session.state in State
        assert before is self.session.state or any(
            self.session.state is target for (s, _), target in TRANSITIONS.items() if s is before)
        return result

    ready = precondition(lambda self: hasattr(self, "session"))

    @ready
    @rule(tokens=TOKENS, client=st.sampled_from([DRAFTER, OTHER]), round_shift=st.integers(-1, 1),
          base_shift=st.integers(-1, 1), epoch_shift=st.integers(-1, 1), drop_q=st.booleans())
    def propose(self, tokens, client, round_shift, base_shift, epoch_shift, drop_q):
        s = self.session
        p = proposal(s, tokens)
        p = replace(p, round=max(0, p.round + round_shift), base=max(0, p.base + base_shift),
                    epoch=max(0, p.epoch + epoch_shift), q_rows=None if drop_q else p.q_rows)
        self._call(s.receive_proposal, p, client=client, now=1.0)

    @ready
    @rule(tokens=st.lists(st.integers(0, 5), min_size=1, max_size=4).map(tuple))
    def propose_well_formed(self, tokens):
        s = self.session
        self._call(s.receive_proposal, proposal(s, tokens[: s.control.limit()]), client=DRAFTER, now=2.0)

    @ready
    @rule(data=st.data(), load=st.integers(0, 100))
    def scored_well_formed(self, data, load):
        s = self.session
        current = s._current
        m = len(current.proposal.tokens) if current is not None and current.proposal else 0
        accepted = data.draw(st.integers(0, m))
        self._call(s.complete_scoring, accepted, data.draw(st.integers(0, 5)), load=load)

    @ready
    @rule(drafter=st.sampled_from([DRAFTER, OTHER]), m_init=st.integers(1, 8), epoch_shift=st.integers(-1, 1))
    def assign(self, drafter, m_init, epoch_shift):
        s = self.session
        a = assignment(s, drafter=drafter, m_init=m_init)
        self._call(s.assign, replace(a, epoch=max(0, a.epoch + epoch_shift)))

    @ready
    @rule(shift=st.integers(-1, 3), top_k=st.integers(0, 4))
    def policy(self, shift, top_k):
        s = self.session
        self._call(s.policy, Policy(session=SID, from_round=max(0, s.round + shift), sampling=Sampling(top_k=top_k)))

    @ready
    @rule(kind=st.sampled_from(["list", "bytes", "none", "zero"]))
    def provide_q(self, kind):
        s = self.session
        m = len(s._current.proposal.tokens) if s._current is not None and s._current.proposal else 1
        if kind == "list":
            self._call(s.provide_q, [0.5] * m)
        elif kind == "zero":
            self._call(s.provide_q, [0.0] * m)
        elif kind == "bytes":
            self._call(s.provide_q, q_rows=q_bytes([[1 / 6] * 6] * m), vocab=6)
        else:
            self._call(s.provide_q)

    @ready
    @rule(accepted=st.integers(-1, 5), token=st.integers(-1, 6), load=st.integers(0, 101))
    def scored(self, accepted, token, load):
        self._call(self.session.complete_scoring, accepted, token, load=load)

    @ready
    @rule(ok=st.booleans(), fenced=st.booleans())
    def appended(self, ok, fenced):
        self._call(self.session.append_done, ok=ok, fenced=fenced)

    @ready
    @rule()
    def self_decode(self):
        work = self._call(self.session.self_decode)
        assert work is None or isinstance(work, ScoreNeeded)

    @ready
    @rule()
    def abandon(self):
        self._call(self.session.abandon)

    @ready
    @rule(roll=st.integers(0, 9))
    def superseded(self, roll):
        # A session-open at a higher epoch replaced the session (registry.py); rarely, so that
        # most runs explore the session alive.
        if roll == 0:
            self._call(self.session.supersede)
            assert self.session.state is State.FENCED

    @ready
    @rule(from_index=st.integers(-1, 14))
    def output(self, from_index):
        self._call(self.session.output, from_index)

    @invariant()
    def committed_prefix_is_consistent(self):
        if not hasattr(self, "session"):
            return
        s = self.session
        assert s.committed == self.released == len(s._output)
        assert s.digest == extend_digest(self.d0, s._output)
        assert s.committed <= s.contract.max_new
        assert all(t not in s.contract.stop for t in s._output[:-1])
        assert 1 <= s.control.m_cap <= s.contract.m_max
        assert (s._current is not None) == (s.state in (State.SCORING, State.COMMITTING))
        assert sorted(s._verdicts) == list(range(s.round - len(s._verdicts) + 1, s.round + 1))


SessionMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
test_session_machine = SessionMachine.TestCase


def test_every_state_has_a_row_per_input_or_is_refused():
    """The table is the whole behaviour: inputs missing for a state are refused, by design."""
    listed = {(s, i) for (s, i) in TRANSITIONS}
    assert (State.FENCED, Input.PROPOSAL) not in listed
    assert all((s, Input.ASSIGN) in listed for s in (State.READY, State.SCORING, State.COMMITTING,
                                                     State.SELF_DECODING))
