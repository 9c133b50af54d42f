"""A deployment on one host (``sdcp-fast up --model toy``) with every object through the MLC
node's shared memory (sdcp_fast/store/shm_client.py) writes the same seeded rule-2 text as
with every object over the network, and as the same session run in process: at a fixed M (an
adaptive M follows measured costs) and with both drafters of one kind (a seeded rule-2 session
repeats its draws only with the same proposals, docs/reliability.md, "Rule 2 and the shape of
rounds", and the router gives a session whichever drafter is less loaded)."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from sdcp_fast.cache.http_client import mlc_transport
from sdcp_fast.deploy.up import Up
from sdcp_fast.protocol.cbor import decode
from sdcp_fast.transport.tls import client_context
from tests.deploy.conftest import toy_up
from tests.faults.faultkit import Job, reference, words

pytestmark = pytest.mark.services

# The session id fixes the draws of a seeded rule-2 completion.
JOB = Job("the verifier commits", 24, bytes.fromhex("5d" * 16), seed=3)
M = 4


def completion(up: Up) -> str:
    e = up.endpoints()
    body = JOB.body(stream=False)
    out = subprocess.run(["curl", "-sS", "-H", f"Authorization: Bearer {e['api_key']}", "-d", json.dumps(body),
                          e["frontend"] + "completions"], capture_output=True, text=True, timeout=120)
    text: str = json.loads(out.stdout)["choices"][0]["text"]
    return text


def slots_kept(up: Up) -> int:
    """How many uploads the MLC node kept as slots (``GET /shm``)."""
    e = up.endpoints()

    async def ask() -> int:
        transport = mlc_transport(client_context(e["client_cert"], e["client_key"], e["ca"]))
        try:
            out = await transport.request(up.services["mlc"].uri + "/", "GET", "shm")
            assert out.status == 200, out.body
            return int(decode(out.body)["adopted"])
        finally:
            await transport.close()

    return asyncio.run(ask())


def test_seeded_rule2_text_is_the_same_with_objects_through_shared_memory(tmp_path, monkeypatch):
    texts, kept = [], []
    for min_bytes in (1, 1 << 62):  # every object through shared memory; none
        monkeypatch.setenv("SDCP_SHM_MIN_BYTES", str(min_bytes))
        with toy_up(tmp_path / str(min_bytes), fixed_m=M, drafters=("toy-good", "toy-good")) as up:
            texts.append(completion(up))
            kept.append(slots_kept(up))
    assert texts[0] == texts[1] and texts[0]
    assert texts[0].split() == words(reference([JOB], M)[0])
    assert kept[0] > 0 and kept[1] == 0
