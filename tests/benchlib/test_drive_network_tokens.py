"""Over the network a failed stream reports no usage: its tokens are the verifiers' emitted
count beyond what the other sessions reported, shared by text, and marked as estimated."""

from __future__ import annotations

from sdcp_fast.benchlib.drive_network import estimate_missing_tokens
from sdcp_fast.benchlib.figures import summarize
from sdcp_fast.benchlib.samples import RunSample, SessionSample


def _run(emitted: float) -> tuple[RunSample, dict[int, list[tuple[float, str]]]]:
    run = RunSample("remote", 2, 0, wall=2.0, counters={"sdcp_emitted_tokens_total": emitted})
    ok = SessionSample(0, "prose", 0.0, 0.0, first=0.1, finished=1.0, tokens=10, chunks=[(0.1, 4), (0.5, 6)])
    failed = SessionSample(1, "code", 0.0, 0.0, first=0.2, finished=0.9, problems=["RuntimeError: failed"])
    run.samples += [ok, failed]
    return run, {0: [(0.1, "abcd"), (0.5, "efghij")], 1: [(0.2, "xx"), (0.6, "yyyyyy")]}


def test_a_failed_session_gets_the_rest_of_the_emitted_tokens_by_its_text() -> None:
    run, pieces = _run(18.0)
    estimate_missing_tokens(run, pieces)
    ok, failed = run.samples
    assert ok.tokens == 10 and not ok.tokens_estimated
    assert failed.tokens == 8 and failed.tokens_estimated and failed.chunks == [(0.2, 2.0), (0.6, 6.0)]
    fig = summarize([run])
    assert fig["tokens"] == 18 and fig["sessions_failed"] == 1 and fig["sessions_tokens_estimated"] == 1


def test_without_the_deployment_counts_nothing_is_made_up() -> None:
    run, pieces = _run(0.0)
    run.counters.clear()
    estimate_missing_tokens(run, pieces)
    assert run.samples[1].tokens == 0 and not run.samples[1].tokens_estimated
