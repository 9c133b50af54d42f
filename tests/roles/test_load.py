"""roles/load.py: a verifier's reported load counts prefill work, while the pass runs and after."""

from __future__ import annotations

from sdcp_fast.roles.load import Gpu, VerifierLoad


class NoGpu(Gpu):
    def __init__(self) -> None:
        self._handle = None


def test_a_long_prefill_in_one_round_counts_as_a_full_pass_while_it_runs() -> None:
    load = VerifierLoad(64, gpu=NoGpu())
    load.batch(1, fed=10_000)  # one session, a 10,000-token prompt
    assert load.percent() == 100
    load.done()
    assert 25 <= load.percent() <= 35  # then in the decayed average of recent passes


def test_a_prompt_waiting_for_its_prefill_chunks_counts_as_the_passes_it_fills() -> None:
    load = VerifierLoad(64, gpu=NoGpu())
    load.batch(4, fed=4 + 32)  # four decoding rounds and a 32-token chunk of a long prompt
    load.prefill = 3_900
    assert load.percent() == 100
    load.prefill = 64 * 9 // 2
    assert load.percent() == 50
    load.prefill = 0
    assert load.percent() < 20


def test_decoding_rounds_count_by_batch_occupancy() -> None:
    load = VerifierLoad(64, gpu=NoGpu())
    load.batch(32, fed=32 * 5)
    assert load.percent() == 50
    load.done()
    load.batch(1, fed=9)
    assert load.percent() < 20
