"""roles/verifier_config.py: a verifier is built from one VerifierConfig, and its parts share
one context."""

from __future__ import annotations

import dataclasses

import pytest

from sdcp_fast.roles.verifier_config import VerifierConfig

from .rolekit import ROUTER, VERIFIER, Rig, run, verifier_config

SETTINGS = dict(router=ROUTER, max_batch=3, batch_wait=0.25, self_decode_idle=2.0, prefill_chunk=8, prefill_solo=16,
                kv_publish_tokens=5, kv_publish_growth=0.5, output_wait=1.5, status_ttl_ms=700)


def test_each_part_takes_its_settings_from_the_one_config(tmp_path):
    async def scenario():
        async with Rig(str(tmp_path), **SETTINGS) as rig:
            v = rig.verifier
            b, c, kv = v.batcher, v.committer, v.kv
            assert (b.max_batch, b.batch_wait, b.self_decode_idle, b.prefill_chunk, b.prefill_solo) == (
                3, 0.25, 2.0, 8, 16)
            assert (kv.publish_tokens, kv.publish_growth) == (5, 0.5)
            assert (c.uri, c.router, v.uri) == (VERIFIER, ROUTER, VERIFIER)
            assert v.load.max_batch == 3 and v.status().ttl_ms == 700
            for part in (b, c, kv):  # one context: the same objects, metrics and background tasks
                assert part.objects is v.context.objects and part.metrics is v.context.metrics
            assert c.background is kv.background is v.context.background
            assert b.clock is c.clock is v.context.clock

    run(scenario())


def test_the_config_is_a_value():
    config = verifier_config(**SETTINGS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_batch = 4  # type: ignore[misc]
    assert dataclasses.replace(config, max_batch=4) == verifier_config(**{**SETTINGS, "max_batch": 4})
    with pytest.raises(TypeError):
        VerifierConfig(VERIFIER, b"")  # type: ignore[misc]  # by name only: a setting is never positional
