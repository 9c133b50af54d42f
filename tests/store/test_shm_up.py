"""A deployment on one host (``sdcp-fast up --model toy``) with every object through the MLC
node's shared memory (sdcp_fast/store/shm_client.py) writes the same seeded rule-2 text as
with every object over the network (at a fixed M: an adaptive M follows measured costs)."""

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

pytestmark = pytest.mark.services

SESSION = "5d" * 16  # the session id fixes the draws of a seeded rule-2 completion


def completion(up: Up) -> str:
    e = up.endpoints()
    body = {"model": "toy", "prompt": "the verifier commits", "max_tokens": 24, "temperature": 0.8, "seed": 3,
            "sdcp_session": SESSION}
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


@pytest.mark.skip(reason="the seeded rule-2 text of sdcp-fast up varies between deployments with shared memory off "
                         "too (two texts seen for one seed and session at a fixed M); the bytes through shared memory "
                         "are checked equal to the network's in test_shm_client.py")
def test_seeded_rule2_text_is_the_same_with_objects_through_shared_memory(tmp_path, monkeypatch):
    texts, kept = [], []
    for min_bytes in (1, 1 << 62):  # every object through shared memory; none
        monkeypatch.setenv("SDCP_SHM_MIN_BYTES", str(min_bytes))
        # A fixed M: the adaptive choice follows measured costs, which change with the path.
        with toy_up(tmp_path / str(min_bytes), fixed_m=4) as up:
            texts.append(completion(up))
            kept.append(slots_kept(up))
    assert texts[0] == texts[1] and texts[0]
    assert kept[0] > 0 and kept[1] == 0
