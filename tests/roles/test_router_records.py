"""Routing records in the MLC (roles/router_records.py; docs/interpretations.md, "Routing
records"): a restarted router adopts the live sessions its index names and routes them on; a
finished session, a malformed or foreign record, and a session another router took are left
alone, each with a log line."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from sdcp_fast.deploy.local import ROUTER, Deployment
from sdcp_fast.model.toy import EOS, decode, encode
from sdcp_fast.protocol.peer import Peer, PeerRole
from sdcp_fast.protocol.routing_records import decode_index, decode_record, encode_index
from sdcp_fast.protocol.status_table import StatusTable
from sdcp_fast.roles.router import RouterRole, serving_spec
from sdcp_fast.roles.wire import SdcpClient
from sdcp_fast.transport import loop
from tests.roles.test_frontend import PROMPT, greedy
from tests.roles.test_frontend_resume import OTHER, two_routers


def restarted(d: Deployment, table: StatusTable | None = None) -> RouterRole:
    """The router of ``d`` as a new process of it would be: same URI and scope, nothing in memory
    (but ``table``, where given: the statuses it would hear again)."""
    a = d.router
    return RouterRole(uri=ROUTER, mlc=a.mlc, transport=d.network.transport(Peer(ROUTER, PeerRole.ROUTER)),
                      target_digest=a.target_digest, tokenizer_digest=a.tokenizer_digest, drafter_models={},
                      scope=a.scope, clock=a.clock, table=table)


def test_a_restarted_router_adopts_its_live_sessions_and_routes_them_to_their_end(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[int], list[int], int, str]:
        async with two_routers(tmp_path) as (d, _, _, target):
            routed = await d.router.open(serving_spec(encode(PROMPT), max_new=60))
            await d.router.close()  # its process ends: the sweep stops, nothing in memory is kept
            again = restarted(d, table=d.router.table)
            d.network.register(ROUTER, again.handler)  # the verifier's events reach the new process
            await again.start()
            try:
                await again.adopt_listed()
                tokens, _ = await again.text(routed.session)
                record = decode_record(bytes(await again.mlc.get(again.records.name(routed.session))))
                return tokens, greedy(target, encode(PROMPT), 60), len(again.records.index), record.router
            finally:
                await again.close()

    tokens, expected, listed, router = loop.run(scenario())
    assert decode(tokens).split() == decode([t for t in expected if t != EOS]).split()
    assert listed == 0 and router == ROUTER  # finished: off the index, the record says so


def test_a_session_whose_record_could_not_be_read_at_a_restart_stays_on_the_index(tmp_path: Path) -> None:
    """The restarted router starts from the index it read: the sessions it adopted are on it
    already, and one whose record the MLC failed to give this time is still there for the
    next start, not dropped when the index is next written."""
    async def scenario() -> tuple[bool, bool, set[bytes], bool, bytes, bytes]:
        async with two_routers(tmp_path) as (d, _, _, _):
            kept = await d.router.open(serving_spec(encode(PROMPT), max_new=4000))
            missed = await d.router.open(serving_spec(encode(PROMPT), max_new=4000))
            await d.router.close()
            again = restarted(d)
            store, get = again.mlc, again.mlc.get
            failed = []

            async def flaky_get(name, *args, **kwargs):  # type: ignore[no-untyped-def]
                if name == again.records.name(missed.session) and not failed:
                    failed.append(name)
                    raise ConnectionError("the MLC dropped the connection")
                return await get(name, *args, **kwargs)

            store.get = flaky_get  # type: ignore[method-assign]
            try:
                await again.adopt_listed()
            finally:
                del store.get  # the instance's own method again
            adopted = (kept.session in again.sessions, missed.session in again.sessions)
            index = set(decode_index(bytes(await store.get(again.records.index_name()))))
            later = restarted(d)
            await later.adopt_listed()
            adopted_later = missed.session in later.sessions
            for session in (kept.session, missed.session):
                await later.cancel(session)
            return *adopted, index, adopted_later, kept.session, missed.session

    kept_adopted, missed_adopted, index, adopted_later, kept, missed = loop.run(scenario())
    assert kept_adopted and not missed_adopted
    assert index == {kept, missed}
    assert adopted_later


def test_finished_malformed_foreign_and_taken_records_are_not_adopted(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[dict[str, bool], bool, bool]:
        async with two_routers(tmp_path) as (d, _, b, _):
            a = d.router
            finished = await a.open(serving_spec(encode(PROMPT), max_new=4))
            await a.text(finished.session)
            taken = await a.open(serving_spec(encode(PROMPT), max_new=4000))
            assert await b.adopt(taken.session) is not None  # a client resumed it at b
            still_ours = await a.recovery.still_ours(taken)
            gone_from_a = taken.session not in a.sessions
            malformed, foreign = bytes([1]) * 16, bytes([2]) * 16
            await a.mlc.put(a.records.name(malformed), b'{"format": "sdcp-fast-routing/1", "open": 5}')
            await a.mlc.put(a.records.name(foreign), b"\x00\x01 not ours")
            listed = {finished.session, malformed, foreign, taken.session}
            await a.mlc.put(a.records.index_name(), encode_index(ROUTER, listed))
            again = restarted(d)
            await again.adopt_listed()
            adopted = {name: s in again.sessions for name, s in
                       (("finished", finished.session), ("malformed", malformed), ("foreign", foreign),
                        ("taken", taken.session))}
            await b.cancel(taken.session)
            return adopted, still_ours, gone_from_a

    with caplog.at_level(logging.INFO, logger="sdcp_fast.router"):
        adopted, still_ours, gone_from_a = loop.run(scenario())
    assert adopted == {"finished": False, "malformed": False, "foreign": False, "taken": False}
    assert not still_ours and gone_from_a
    lines = [r.getMessage() for r in caplog.records]
    assert any("not adopted: it finished" in line for line in lines)
    assert sum("routing record ignored" in line for line in lines) == 2
    assert any(f"not adopted: router {OTHER} routes it now" in line for line in lines)
    assert any(f"router {OTHER} routes it now; letting it go" in line for line in lines)


def test_a_verifier_serving_two_routers_reports_to_both_and_takes_a_cancel_from_either(tmp_path: Path) -> None:
    """``--router A,B`` (as two_routers sets it): status and events to each; DELETE
    sessions/{id} from either, not from a third."""
    async def scenario() -> tuple[bool, bool, set[str], str, bool]:
        async with two_routers(tmp_path) as (d, _, b, _):
            b.table = StatusTable()
            await d.verifier.report_status()
            heard = b.table.live(d.verifier.uri, b.clock())
            told: list[str] = []
            send = d.verifier.committer.client.event

            async def event(router, message):  # type: ignore[no-untyped-def]
                told.append(router)
                return await send(router, message)

            d.verifier.committer.client.event = event  # type: ignore[method-assign]
            short = await d.router.open(serving_spec(encode(PROMPT), max_new=3))
            await d.router.text(short.session)  # its finish event goes to both
            for _ in range(200):
                if len(set(told)) == 2:
                    break
                await asyncio.sleep(0.01)
            routed = await d.router.open(serving_spec(encode(PROMPT), max_new=4000))
            third = "inproc://router-c/"
            refused = ""
            try:
                await SdcpClient(d.network.transport(Peer(third, PeerRole.ROUTER))).cancel(d.verifier.uri,
                                                                                          routed.session)
            except Exception as exc:  # noqa: BLE001 - the problem's type is what is checked
                refused = type(exc).__name__
            taken = await b.adopt(routed.session) is not None
            await b.cancel(routed.session)
            gone = routed.session not in {s.session for s in d.verifier.sessions}
            return heard, taken, set(told), refused, gone

    heard, taken, told, refused, gone = loop.run(scenario())
    assert heard and taken and gone
    assert told == {ROUTER, OTHER}
    assert refused == "Forbidden"
