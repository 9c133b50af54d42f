"""Each session alone (B = 1) in the bench: a measured run becomes one side of a pair, its
drafter rounds counted apart from the rounds the verifier decoded itself. The pairs
themselves run in tests/benchlib/test_run.py."""

from __future__ import annotations

from sdcp_fast.benchlib.alone import timed
from sdcp_fast.benchlib.samples import RoundSample, RunSample, SessionSample
from sdcp_fast.benchlib.speedup import Timed


def test_a_run_is_one_side_of_a_pair() -> None:
    run = RunSample("toy-good", 1, 0, wall=0.5, samples=[SessionSample(0, "toy", 0.0, 0.0, tokens=9)],
                    rounds=[RoundSample(0.1, 0, "toy-good", 4, 3, 4, "continue", 4, 1),
                            RoundSample(0.2, 0, "toy-good", 4, 1, 2, "reduce", 2, 1),
                            RoundSample(0.3, 0, None, 0, 0, 3, "finish", 0, 1)],
                    passes=[(1, 0.1), (1, 0.1), (1, 0.1), (1, 0.05)], phases={"draft": 0.02, "scoring": 0.35})
    assert timed(run) == Timed(9, 0.5, 4, proposed=8, accepted=4, rounds=2, session_passes=3, draft_seconds=0.02)
