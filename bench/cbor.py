"""CBOR codec micro-bench: the Python codec against the native one, in the same run.

The hot messages of a round (a proposal, its verdict, the commit record the verifier
appends), a 15.7 MiB commit record (3.3 M tokens of five-byte heads), and the MLC's CBOR
object form around 500 KB of q rows (which the drafter no longer uses: the rows go as a raw
body), each encoded and decoded by both codecs of :mod:`sdcp_fast.protocol.cbor`; ``msg``
rows time the whole message codec (``Proposal.encode()``/``Proposal.decode()``: CDDL checks
included) on each codec.

    nice .venv/bin/python bench/cbor.py [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.commitlog import CommitRecord, decode_record, encode_record
from sdcp_fast.protocol.messages import Action, Proposal, Status, Verdict


def _time(fn: Callable[[], Any], seconds: float) -> float:
    """Seconds per call: the fastest of batches filling about ``seconds`` (on a shared machine
    the fastest batch is the one least slowed by other work)."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, int(seconds / 5 / once))
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < 50):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter() - t0) / per_batch)
    return min(samples)


def messages() -> dict[str, Any]:
    status = Status(instance="drafter-3.example:8443", role=1, load=37, queue=2, ttl_ms=3000, accept_milli=812)
    proposal = Proposal(session=bytes(range(16)), epoch=2, round=117, drafter="drafter-3.example:8443",
                        base=1904, base_digest=bytes(range(32)), tokens=(40123, 871, 9, 128000, 2207, 31999),
                        status=status, q_rows="mlc://scope/sessions/000102/q_rows/118.d3")
    verdict = Verdict(session=bytes(range(16)), epoch=2, round=117, accepted=4, emitted=(40123, 871, 9, 128000, 77),
                      committed=1909, digest=bytes(range(32, 64)), action=Action.CONTINUE, m_cap=6, low=0, load=41)
    record = CommitRecord(epoch=2, round=117, emitted=(40123, 871, 9, 128000, 77), committed=1909,
                          digest=bytes(range(32, 64)))
    big = CommitRecord(epoch=2, round=118, emitted=tuple(range(4_000_000_000, 4_000_000_000 - 3_300_000, -1)),
                       committed=3_300_000, digest=bytes(32))
    return {"proposal": proposal, "verdict": verdict, "commit record": record, "commit record 15.7 MiB": big,
            # The MLC's CBOR object form, as q rows (M = 4, V = 32,000) were put before they went raw.
            "q rows in a CBOR object": {"data": bytes(4 * 32_000 * 4), "lease_ms": 30_000,
                                        "meta": {"dtype": "float32", "shape": [4, 32_000]}}}


def run(seconds: float) -> list[tuple[str, str, float, float]]:
    rows: list[tuple[str, str, float, float]] = []
    for name, message in messages().items():
        is_record, is_map = isinstance(message, CommitRecord), isinstance(message, dict)
        raw = cbor.decode(encode_record(message)) if is_record else message if is_map else message.to_map()
        wire = cbor.py_deterministic_cbor(raw)
        label = f"{name} ({len(wire):,} B)"
        per = seconds if len(wire) < 1 << 20 else seconds * 4
        native = cbor._load()[0]
        assert native is not None, cbor.status()
        assert native.encode(raw) == wire and native.decode(wire) == cbor.py_decode(wire)
        rows.append((label, "encode", _time(partial(cbor.py_deterministic_cbor, raw), per),
                     _time(partial(native.encode, raw), per)))
        rows.append((label, "decode", _time(partial(cbor.py_decode, wire), per),
                     _time(partial(native.decode, wire), per)))
        if is_map:
            continue
        if is_record:
            enc: Callable[[], Any] = partial(encode_record, message)
            dec: Callable[[], Any] = partial(decode_record, wire)
        else:
            enc, dec = message.encode, partial(type(message).decode, wire)
        timed: dict[str, tuple[float, float]] = {}
        for codec in (cbor.PY, cbor.C):
            cbor.use(codec)
            timed[codec] = (_time(enc, per), _time(dec, per))
        cbor.use(None)
        rows.append((label, "msg encode", timed[cbor.PY][0], timed[cbor.C][0]))
        rows.append((label, "msg decode", timed[cbor.PY][1], timed[cbor.C][1]))
    return rows


def _fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.2f} us"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="timing budget per small case")
    args = parser.parse_args(argv)
    if not cbor.available():
        print(f"native codec unavailable: {cbor.status()}", file=sys.stderr)
        return 1
    print("| message | op | py | c | py / c |")
    print("|---|---|---:|---:|---:|")
    for label, op, py_s, c_s in run(args.seconds):
        print(f"| {label} | {op} | {_fmt(py_s)} | {_fmt(c_s)} | {py_s / c_s:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
