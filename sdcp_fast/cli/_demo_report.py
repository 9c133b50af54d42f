"""The demo's report, the same in process and across processes: each session's text and
figures, the speculative run's summary, and target-only decoding measured beside it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def baseline_figures(total: int, seconds: float, base_seconds: float,
                     identical: list[bool] | None) -> dict[str, Any]:
    """Target-only decoding of the same ``total`` tokens beside the speculative run: its time,
    rate, the speedup, and (rule 1) whether each session's output is the same."""
    return {"seconds": round(base_seconds, 3), "tokens_per_s": round(total / max(base_seconds, 1e-9), 1),
            "speedup": round(base_seconds / max(seconds, 1e-9), 2), "identical_output": identical}


def report(out: dict[str, Any], args: argparse.Namespace, details: Sequence[str], summary: str, *,
           where: str = "", problem: str | None = None) -> int:
    """Print the demo's result, as one JSON object with ``--json``, else each session's text
    with its ``details``, the ``summary`` line and the baseline (run ``where``); the exit
    status is 1 when there is a ``problem`` or rule 1's output differs from the baseline's."""
    base = out["baseline"]
    same = None if base is None else base["identical_output"]
    if problem is None and same is not None and not all(same):
        problem = "the output differs from target-only greedy decoding"
    if args.json:
        print(json.dumps(out))
        return 0 if problem is None else 1
    print()
    for i, (session, detail) in enumerate(zip(out["sessions"], details, strict=True)):
        print(f"session {i}: {session['prompt']!r}\n  {session['text'].strip()!r}\n  {detail}")
    print(f"\n{summary}")
    if base is not None:
        print(f"target-only{where}: {out['tokens']} tokens in {base['seconds']:.2f}s ({base['tokens_per_s']} tokens/s), "
              f"1 token per pass")
        print(f"speedup {base['speedup']}x" + ("" if same is None else
              f"; output identical to target-only greedy decoding: {'yes' if all(same) else 'NO'}"))
    if problem is not None:
        print(f"sdcp-fast demo: {problem}", file=sys.stderr)
    return 0 if problem is None else 1
