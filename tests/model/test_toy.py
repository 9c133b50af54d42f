"""The toy target's batched pass against its definition: logits = A[previous] + B[the one
before], with ``<eos>`` before the first token, computed over the whole context."""

from __future__ import annotations

import random

import pytest
import torch

from sdcp_fast.model.interfaces import Logits, ScoreRequest
from sdcp_fast.model.toy import EOS, WORDS, ToyDrafter, ToyTarget


def definition(target: ToyTarget, context: list[int], start: int) -> torch.Tensor:
    """Rows start..len(context), each from the whole padded context (``[R, V]``)."""
    ctx = [EOS, *context]
    return torch.stack([target.table[ctx[i]] + target.table2[ctx[i - 1]] for i in range(start, len(ctx))])


def test_one_pass_over_ragged_requests_gives_the_definitions_rows_bit_for_bit():
    target, rnd = ToyTarget(), random.Random(3)
    batch = [ScoreRequest(bytes([i]), [rnd.randrange(len(WORDS)) for _ in range(n)],
                          [rnd.randrange(len(WORDS)) for _ in range(m)])
             for i, (n, m) in enumerate([(1, 0), (1, 4), (2, 0), (2, 3), (3, 1), (300, 5), (17, 0)])]
    out = target.score(batch)
    assert isinstance(out, Logits) and out.rows.shape == (sum(len(r.proposal) + 1 for r in batch), len(WORDS))
    for request, rows in zip(batch, out, strict=True):
        want = definition(target, [*request.committed, *request.proposal], len(request.committed))
        assert torch.equal(rows, want)
    assert target.passes == 1


@pytest.mark.parametrize("start", [1, 2, 5, 9])
def test_logits_read_only_the_tail_and_match_the_definition(start):
    target, context = ToyTarget(), [4, 9, 12, 3, 3, 7, 20, 1, 5]
    assert torch.equal(target.logits(context, start), definition(target, context, start))


def test_logits_refuse_a_row_with_no_token_before_it():
    with pytest.raises(ValueError):
        ToyTarget().logits([4, 9], 0)


def test_the_drafter_proposes_what_the_definition_does():
    target = ToyTarget()
    drafter = ToyDrafter("toy-good", target, 0.8)
    committed = [2, 5, 9, 14]
    want, context = [], list(committed)
    for _ in range(6):
        token = int(torch.argmax(definition(target, context, len(context))[0] + drafter.noise[context[-1]]))
        want.append(token)
        context.append(token)
    assert drafter.propose(b"s", committed, 6, rule=1).tokens == want
