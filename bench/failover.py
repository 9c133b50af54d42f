"""Time to first token after a verifier fail-over, with and without target KV pages
(docs/reliability.md, scenario 2; draft §6.9 ``resume.target_kv``).

The roles run in one process on the in-process transport (router, two verifiers, a drafter,
the embedded MLC). A session with a ``--prompt`` token prompt commits ``--before`` tokens at
verifier A, which then falls silent; the router's sweep fails it over to verifier B. The time
measured runs from the sweep (fence, read, open at B with ``resume``, re-assign) to the first
token of the new epoch in the front end's output stream: B's first round, which is where a
cold B prefills prompt and output and a B with pages computes only the positions after them.
The drafter is the target itself (rule 1, every proposal accepted, fixed M), so both runs
propose the same tokens. A publishes its pages (default cadence) in both; they differ only in
whether B imports them ("pages") or prefills prompt and output itself ("cold").

    .venv/bin/python bench/failover.py                     # tiny-target, 3 repeats
    .venv/bin/python bench/failover.py --model smollm2 --prompt 512 --repeats 3

Prints one line per run and the medians; ``--json FILE`` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch


def _counter(role: Any, name: str, **labels: str) -> float:
    value = role.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else float(value)


async def one_failover(model: Any, *, pages: bool, prompt: list[int], before: int, m: int, device: str,
                       root: str, n: int) -> dict[str, Any]:
    from sdcp_fast.cache import object_uri
    from sdcp_fast.model.contract_digests import model_digest
    from sdcp_fast.model.drafters import ModelDrafter
    from sdcp_fast.model.target_scorer import ModelRunner
    from sdcp_fast.protocol.peer import Peer, PeerRole
    from sdcp_fast.roles.drafter import DrafterRole
    from sdcp_fast.roles.router import RouterRole, SessionSpec
    from sdcp_fast.roles.verifier import VerifierConfig, VerifierRole
    from sdcp_fast.store import embedded
    from sdcp_fast.transport.inprocess import InProcessNetwork

    router_uri, a_uri, b_uri, d_uri = ("inproc://router/", "inproc://verifier-a/", "inproc://verifier-b/",
                                       "inproc://drafter/")
    target = model_digest("bench/failover")
    scope = hashlib.sha256(b"bench/failover").digest()[:16]
    session = hashlib.sha256(f"bench/failover/{n}/{pages}".encode()).digest()[:16]
    now = [1000.0]
    network = InProcessNetwork()
    mlc = embedded(root)
    stopped: list[float] = []

    def stop_after(info: Any) -> None:
        # A falls silent once `before` tokens are committed (the round that passes it commits).
        if not stopped and len(a.sessions.get(session).output(0).tokens) >= before:
            stopped.append(time.perf_counter())
            network.unregister(a_uri)

    def verifier(uri: str, **kw: Any) -> VerifierRole:
        config = VerifierConfig(uri=uri, target_digest=target, router=router_uri, batch_wait=0.0, output_wait=1.0)
        role = VerifierRole(ModelRunner(model), config, mlc=mlc, transport=network.transport(Peer(uri, PeerRole.VERIFIER)),
                            **kw)
        network.register(uri, role.handler)
        return role

    router = RouterRole(uri=router_uri, mlc=mlc, transport=network.transport(Peer(router_uri, PeerRole.ROUTER)),
                        target_digest=target, tokenizer_digest=target, scope=scope, clock=lambda: now[0],
                        drafter_models={d_uri: target}, sweep_interval=3600.0)
    network.register(router_uri, router.handler)
    a = verifier(a_uri, on_round=stop_after)
    b = verifier(b_uri, **({} if pages else {"target_kv": None}))
    drafter = DrafterRole(ModelDrafter(model), uri=d_uri, mlc=mlc, router=router_uri, fixed_m=m,
                          transport=network.transport(Peer(d_uri, PeerRole.DRAFTER)))
    network.register(d_uri, drafter.handler)
    try:
        for role in (a, drafter):
            await role.start()
        while router.table.status(d_uri, now[0]) is None or router.table.status(a_uri, now[0]) is None:
            await asyncio.sleep(0.001)
        routed = await router.open(SessionSpec(prompt, max_new=before + 4 * (m + 1), session=session, m_init=m,
                                               m_max=m, low_ratio=None))
        await b.start()
        first: dict[int, float] = {}
        resumed = asyncio.Event()

        async def stream() -> None:
            async for out in router.output(session):
                first.setdefault(out.epoch, time.perf_counter())
                if out.epoch == 2:
                    resumed.set()
                if out.final:
                    return

        reader = asyncio.create_task(stream())
        while not stopped:
            await asyncio.sleep(0.001)
        live = a.live(session)
        while live.kv.busy:  # A's last publish lands (a partition does not stop it)
            await asyncio.sleep(0.001)
        published = _counter(a, "sdcp_target_kv_published_bytes_total")
        now[0] += 3600.0  # A's status expires; B and the drafter report again
        await b.report_status()
        await drafter.report_status()
        t0 = time.perf_counter()
        await router.sweep()
        opened = time.perf_counter()
        await resumed.wait()
        ttft = first[2] - t0
        await asyncio.wait_for(reader, 600)
        ref = object_uri(scope, session, "target_kv", 1)
        return dict(pages=pages, epoch=routed.epoch, ttft_ms=1e3 * ttft, failover_ms=1e3 * (opened - t0),
                    context=len(prompt) + before, published_bytes=int(published),
                    object_bytes=mlc.mlc.head(ref).size if mlc.mlc.contains(ref) else 0,
                    imported=int(_counter(b, "sdcp_resumed_kv_positions_total")))
    finally:
        for role in (a, drafter, b):
            await role.close()
        mlc.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-target", help="tiny-target, smollm2, or a GGUF / HF directory")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens (random ids)")
    p.add_argument("--before", type=int, default=32, help="tokens committed before the fail-over")
    p.add_argument("--m", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from sdcp_fast.model import loader

    t = time.perf_counter()
    model = loader.load(args.model).model.to(args.device)
    print(f"{args.model}: loaded in {time.perf_counter() - t:.1f} s; prompt {args.prompt}, {args.before} committed "
          f"before the fail-over, M={args.m}, {args.device}, {args.threads} threads", flush=True)
    prompt = torch.randint(0, model.cfg.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    import tempfile

    runs: list[dict[str, Any]] = []
    for n in range(args.repeats):
        for pages in (False, True):
            with tempfile.TemporaryDirectory() as root:
                run = asyncio.run(one_failover(model, pages=pages, prompt=prompt, before=args.before, m=args.m,
                                               device=args.device, root=root, n=n))
            runs.append(run)
            print(f"  {'pages' if pages else 'cold '}  ttft {run['ttft_ms']:8.1f} ms  (fail-over call "
                  f"{run['failover_ms']:7.1f} ms)  context {run['context']}  imported {run['imported']}  "
                  f"object {run['object_bytes'] / 2**20:.2f} MiB", flush=True)
    summary = {}
    for pages in (False, True):
        ttft = [r["ttft_ms"] for r in runs if r["pages"] == pages]
        summary["pages" if pages else "cold"] = statistics.median(ttft)
    print(f"median ttft after fail-over: cold {summary['cold']:.1f} ms, pages {summary['pages']:.1f} ms "
          f"({summary['cold'] / summary['pages']:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs,
                                         "median_ttft_ms": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
