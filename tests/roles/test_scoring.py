"""roles/scoring.py: one verification batch through the kernels. A batch answers each
session as a batch of that session alone would (rule 1 and rule 2 mixed, ragged M, odd batch
sizes and vocabularies), and reads the results on the host once per batch, not per session."""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sdcp_fast.kernels.backends import BackendUnavailable, resolve
from sdcp_fast.model.interfaces import Logits
from sdcp_fast.protocol import Sampling
from sdcp_fast.protocol.messages import RULE_GREEDY, RULE_SPECULATIVE
from sdcp_fast.protocol.session import ScoreNeeded, Uniforms
from sdcp_fast.roles import scoring
from sdcp_fast.roles.scoring import Scored, verify_batch

VOCAB = 37
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "__iter__")
SCORING = str(Path(scoring.__file__).resolve())


def _backends() -> list[str]:
    out = ["reference"]
    try:
        resolve("cpu", torch.device("cpu"))
        out.append("cpu")
    except BackendUnavailable:
        pass
    return out


def _item(rng: random.Random, index: int, rule: int) -> tuple[Scored, torch.Tensor]:
    """A round of ``rule`` with 1..5 proposed tokens, and its target logits ``[M + 1, V]``."""
    m = rng.randint(1, 5)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    logits = torch.randn(m + 1, VOCAB, generator=gen) * 3
    # Some proposals follow the target's argmax for a while, so that acceptances vary.
    follow = rng.randint(0, m)
    proposed = tuple(int(logits[i].argmax()) if i < follow else rng.randrange(VOCAB) for i in range(m))
    q = None
    uniforms = None
    sampling = None
    if rule == RULE_SPECULATIVE:
        q = torch.softmax(torch.randn(m, VOCAB, generator=gen), dim=-1)
        uniforms = Uniforms(accept=tuple(rng.random() for _ in range(m + 1)),
                            draw=tuple(rng.random() for _ in range(m + 1)))
        sampling = rng.choice([None, Sampling(temperature_milli=700), Sampling(top_k=5), Sampling(top_p_milli=900)])
    work = ScoreNeeded(session=bytes([index]) * 16, round=1, prompt=(1, 2), output=(), proposed=proposed,
                       sampling=sampling, rule=rule, needs_q=False, q_rows=None, uniforms=uniforms)
    return Scored(work, q), logits


def _batch(seed: int, size: int, rules: tuple[int, ...]) -> tuple[list[Scored], list[torch.Tensor]]:
    rng = random.Random(seed)
    made = [_item(rng, i, rng.choice(rules)) for i in range(size)]
    return [m[0] for m in made], [m[1] for m in made]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("size", [1, 2, 3, 7, 13])
@pytest.mark.parametrize("rules", [(RULE_GREEDY,), (RULE_SPECULATIVE,), (RULE_GREEDY, RULE_SPECULATIVE)],
                         ids=["rule1", "rule2", "mixed"])
def test_a_batch_answers_each_session_as_its_own_batch_would(backend: str, size: int, rules: tuple[int, ...]) -> None:
    items, logits = _batch(1000 * size + len(rules), size, rules)
    batched = verify_batch(items, logits, backend=backend)
    alone = [verify_batch([item], [row], backend=backend)[0] for item, row in zip(items, logits, strict=True)]
    assert batched == alone
    for item, row, (accepted, token) in zip(items, logits, batched, strict=True):
        assert 0 <= accepted <= len(item.work.proposed) and 0 <= token < VOCAB
        if item.work.rule == RULE_GREEDY:  # rule 1 is the argmax walk: checkable by hand
            expected = 0
            while expected < len(item.work.proposed) and int(row[expected].argmax()) == item.work.proposed[expected]:
                expected += 1
            assert (accepted, token) == (expected, int(row[expected].argmax()))


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("rules", [(RULE_GREEDY,), (RULE_SPECULATIVE,), (RULE_GREEDY, RULE_SPECULATIVE)],
                         ids=["rule1", "rule2", "mixed"])
def test_one_logits_tensor_answers_as_the_per_session_tensors_do(backend: str, rules: tuple[int, ...]) -> None:
    """A scorer may return the pass's rows as one ``[R, V]`` tensor (rounds in batch order);
    rows after the rounds' (a prefill chunk's, say) are not read."""
    items, logits = _batch(77 + len(rules), 11, rules)
    expected = verify_batch(items, logits, backend=backend)
    trailing = torch.full((3, VOCAB), float("nan"))
    assert verify_batch(items, torch.cat([*logits, trailing]), backend=backend) == expected
    assert verify_batch(items, [*logits, trailing], backend=backend) == expected


def test_one_logits_tensor_is_not_copied_when_the_batch_is_one_rule() -> None:
    """Rule 1 alone: the kernel reads the scorer's tensor itself (no re-concatenation)."""
    items, logits = _batch(5, 6, (RULE_GREEDY,))
    flat = torch.cat(logits)
    seen: list[int] = []
    original = scoring.kernels.verify_greedy

    def spy(rows: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(rows.data_ptr())
        return original(rows, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scoring.kernels, "verify_greedy", spy)
        verify_batch(items, flat, backend="reference")
        # A model runner's per-request views of one tensor: the kernel reads that tensor.
        verify_batch(items, Logits(flat, [len(x) for x in logits]), backend="reference")
    assert seen == [flat.data_ptr(), flat.data_ptr()]


def test_too_few_logit_rows_is_an_error() -> None:
    items, logits = _batch(9, 4, (RULE_GREEDY,))
    with pytest.raises(ValueError, match="logit rows"):
        verify_batch(items, torch.cat(logits)[:-1], backend="reference")


@contextlib.contextmanager
def _host_reads() -> Iterator[list[str]]:
    """Every read of a tensor's values into Python made by roles/scoring.py itself."""
    seen: list[str] = []

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_code.co_filename == SCORING:
                seen.append(name)
            return original(*args, **kwargs)
        return wrapper

    with pytest.MonkeyPatch.context() as mp:
        for name in HOST_READS:
            mp.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
        yield seen


@pytest.mark.parametrize("size", [1, 2, 5, 9])
@pytest.mark.parametrize("rules", [(RULE_GREEDY,), (RULE_SPECULATIVE,), (RULE_GREEDY, RULE_SPECULATIVE)],
                         ids=["rule1", "rule2", "mixed"])
def test_one_host_read_per_batch_whatever_its_size(size: int, rules: tuple[int, ...]) -> None:
    """On a GPU each read of a device value waits for the device: one per batch, not one or
    two per session."""
    items, logits = _batch(7 + size, size, rules)
    expected = verify_batch(items, logits, backend="reference")
    with _host_reads() as seen:
        assert verify_batch(items, logits, backend="reference") == expected
    assert seen == ["tolist"]


def test_an_empty_batch_reads_nothing() -> None:
    with _host_reads() as seen:
        assert verify_batch([], [], backend="reference") == []
    assert seen == []


def test_a_proposal_the_kernel_flags_is_a_bug_not_an_answer() -> None:
    """The core refuses q(x) = 0 before scoring; should the kernel still flag a session, the
    pass fails (its rounds are dropped and retried) rather than commit a made-up result."""
    items, logits = _batch(3, 3, (RULE_SPECULATIVE,))
    bad = items[1]
    assert bad.q is not None
    bad.q[0, bad.work.proposed[0]] = 0.0
    with pytest.raises(RuntimeError, match="kernel flagged"):
        verify_batch(items, logits, backend="reference")


def test_the_draft_rows_are_gathered_into_one_kept_buffer() -> None:
    """Rule 2's rows go to the kernel as one ``[D, V]`` tensor, copied into a buffer kept
    from pass to pass (a fresh one each pass costs its page faults), equal to their concatenation;
    a larger pass grows it, rows that are not float32 are concatenated as they are."""
    items, _ = _batch(11, 9, (RULE_SPECULATIVE,))
    expected = torch.cat([item.q for item in items])
    first = scoring._draft_rows(items, VOCAB)
    assert torch.equal(first, expected)
    again = scoring._draft_rows(items[:4], VOCAB)
    assert again.data_ptr() == first.data_ptr()
    assert torch.equal(again, torch.cat([item.q for item in items[:4]]))
    more, _ = _batch(12, 20, (RULE_SPECULATIVE,))
    assert torch.equal(scoring._draft_rows(more, VOCAB), torch.cat([item.q for item in more]))
    doubles = [Scored(item.work, item.q.double()) for item in items[:2]]
    assert scoring._draft_rows(doubles, VOCAB).dtype == torch.float64


@pytest.mark.parametrize("backend", _backends())
def test_on_the_host_the_kernel_reads_each_rounds_rows_where_they_lie(backend: str, monkeypatch) -> None:
    """Logits on the host: rule 2's rows go to the kernel as each round's own tensor (rows read
    in place from shared memory, not gathered into a staging buffer), answering as gathered."""
    items, logits = _batch(21, 7, (RULE_SPECULATIVE,))
    expected = [verify_batch([item], [row], backend=backend)[0] for item, row in zip(items, logits, strict=True)]
    given: list[Any] = []
    verify = scoring.kernels.verify_speculative

    def recorded(*args: Any, **kw: Any) -> Any:
        given.append(args[4])
        return verify(*args, **kw)

    monkeypatch.setattr(scoring.kernels, "verify_speculative", recorded)
    monkeypatch.setattr(scoring, "_draft_rows", None)  # not called
    assert verify_batch(items, logits, backend=backend) == expected
    assert isinstance(given[-1], list) and all(q is item.q for q, item in zip(given[-1], items, strict=True))


def test_a_flagged_round_whose_rows_moved_is_answered_alone() -> None:
    """Rows read in place that their writer rewrote while the kernel read them may be flagged:
    that round's result is None (its caller answers it sdcp-q-unavailable) and the pass's other
    rounds keep theirs; a flagged round whose rows did not move is still a kernel bug."""
    items, logits = _batch(3, 3, (RULE_SPECULATIVE,))
    expected = verify_batch(items, logits, backend="reference")
    bad = items[1]
    assert bad.q is not None
    bad.q[0, bad.work.proposed[0]] = 0.0
    got = verify_batch(items, logits, backend="reference", moved=lambda item: item is bad)
    assert got == [expected[0], None, expected[2]]
    with pytest.raises(RuntimeError, match="kernel flagged"):
        verify_batch(items, logits, backend="reference", moved=lambda item: False)
