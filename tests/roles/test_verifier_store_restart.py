"""The verifier while the MLC holding its commit log restarts (§6.3 commit before release, §6.8,
§6.9 lost messages): an append whose answer is a 412 and whose log read then fails too leaves
nothing released and the round open to the drafter's retry, which commits it exactly once,
whether or not the first append landed. (Found by tests/faults, the MLC-restart scenario: such
a round stayed half-done, every retry was "pending" and no append was tried again.)"""

from __future__ import annotations

import pytest

from sdcp_fast.cache import object_uri
from sdcp_fast.commitlog import PreconditionFailed
from sdcp_fast.protocol.commitlog import CommitRecord
from sdcp_fast.store.logs import ThreadedLog

from .rolekit import SCOPE, VERIFIER, Rig, contract, proposal, run, sid

S = sid(71)


class RestartingLog:
    """A commit log whose next append answers 412 (``lands``: after appending for real, as a
    retried request whose first try got through would) while its reads fail as an unreachable
    store's, until the store is ``back``."""

    def __init__(self, log):
        self.log = log
        self.down = False
        self.lands = False

    def append(self, record, etag):
        if self.down:
            if self.lands:
                self.log.append(record, etag)
            raise PreconditionFailed("another append happened since the tag")
        return self.log.append(record, etag)

    def read(self, *args):
        if self.down:
            raise ConnectionError("the MLC is restarting")
        return self.log.read(*args)

    def __getattr__(self, name):
        return getattr(self.log, name)


@pytest.mark.parametrize("lands", [False, True], ids=["lost", "landed"])
def test_a_412_while_the_log_cannot_be_read_leaves_the_round_to_the_retry(tmp_path, lands):
    async def scenario():
        async with Rig(str(tmp_path)) as rig:
            logs = []
            real = rig.store.logs.log

            async def commit_log(name):
                logs.append(RestartingLog(real(name)))
                return ThreadedLog(logs[-1])

            rig.store.commit_log = commit_log
            _, state = await rig.open(S, contract(max_new=16), m_init=3)
            first = await rig.drafter.propose(VERIFIER, proposal(state, rig.greedy_after(state, 3)))
            logs[0].down, logs[0].lands = True, lands
            tokens = rig.greedy_after(first, 3)
            with pytest.raises(Exception) as refused:
                await rig.drafter.propose(VERIFIER, proposal(first, tokens))
            released_while_down = rig.output_of(S)
            logs[0].down = False  # the MLC is back: the drafter sends the same proposal again
            second = await rig.drafter.propose(VERIFIER, proposal(first, tokens))
            records = real(object_uri(SCOPE, S, "commit_log")).read().records
            return refused.value, first, released_while_down, second, records, rig.output_of(S)

    refused, first, while_down, second, records, output = run(scenario())
    assert getattr(refused, "status", 0) >= 500  # a 5xx: the drafter retries (§6.9)
    assert while_down == list(first.emitted)  # nothing of the unappended round was released
    assert second.round == 2 and second.accepted == 3
    commits = [r for r in records if isinstance(r, CommitRecord)]
    assert [r.round for r in commits] == [1, 2]  # the round committed once, landed or not
    assert output == [t for r in commits for t in r.emitted]
