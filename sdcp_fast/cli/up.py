"""``sdcp-fast up``: the embedded default, every role its own process on loopback with
development certificates: an MLC, a router (and its OpenAI-compatible front end), a verifier,
a standby verifier and two drafters of different kinds. Runs until interrupted."""

from __future__ import annotations

import argparse

HELP = "start the embedded default deployment (MLC, router, two verifiers, two drafters) on loopback"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", help="folder for certificates, logs, the MLC and endpoints.json (default: a temporary one)")
    p.add_argument("--model", default="auto", help="target: toy, smollm2, a GGUF or HF directory (default auto)")
    p.add_argument("--drafters", help="two drafter specs, comma-separated (default: ngram,model:smollm2-draft; "
                                      "toy-good,toy-weak for the toy target)")
    p.add_argument("--base-port", type=int, default=None,
                   help="first of six consecutive ports (default: free ports chosen at start)")
    p.add_argument("--status-ttl-ms", type=int, default=3000,
                   help="status ttl of every instance: a dead verifier is failed over after about this long")
    p.add_argument("--m", type=int, default=None,
                   help="the drafters' fixed M (default: each chooses M by §6.2 from measured acceptance and costs)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="sessions per scoring pass at most, of each verifier (default: the verifier's own, 64)")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="prompt tokens per scoring pass at most, of each verifier (default: the verifier's own, "
                        "512 on a GPU, 32 on the CPU)")
    p.add_argument("--prefill-solo", type=int, default=None,
                   help="prompt tokens a scoring pass feeds at most when no decoding round shares it, of each "
                        "verifier (default: the verifier's own, 4096 on a GPU, 512 on the CPU)")
    p.add_argument("--routers", type=int, default=1, metavar="N",
                   help="routers over the same routing records, each with its own front end; a client "
                        "resumes its stream at any of them (default 1)")
    p.add_argument("--device", default=None,
                   help="where the verifiers and drafters run their models: cpu, cuda, cuda:N (default: the "
                        "services' own, the CPU)")
    p.add_argument("--timeout", type=float, default=180.0, metavar="S",
                   help="seconds every service has to start (load its model, build kernels, listen) before up "
                        "gives up (default 180); a loaded machine needs more")
    p.add_argument("--max-inflight-per-key", type=int, default=None, metavar="N",
                   help="front end: requests in flight per API key at most; more wait their turn (default: the "
                        "router's, 64)")
    p.add_argument("--max-inflight", type=int, default=None, metavar="N",
                   help="front end: requests in flight in all at most (default: the router's, 256)")
    p.add_argument("--max-queue", type=int, default=None, metavar="N",
                   help="front end: requests waiting their turn at most; one more is 429 (default: the router's, "
                        "1024)")
    p.add_argument("--weights", default=None, choices=("auto", "f32", "bf16", "q8_0", "q4"),
                   help="form of the target's linear layers in every service (default: the services' own, auto)")


def run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import tempfile
    import time
    from pathlib import Path

    from sdcp_fast.deploy.service import configure_logging
    from sdcp_fast.deploy.up import Up

    configure_logging("info")
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sdcp-up-")
        args.dir = tmp.name
    drafters = tuple(d.strip() for d in args.drafters.split(",")) if args.drafters else None
    up = Up(Path(args.dir), model=args.model, drafters=drafters, base_port=args.base_port,
            status_ttl_ms=args.status_ttl_ms, fixed_m=args.m, max_batch=args.max_batch, device=args.device,
            prefill_chunk=args.prefill_chunk, prefill_solo=args.prefill_solo,
            weights=args.weights, routers=max(1, args.routers), max_inflight_per_key=args.max_inflight_per_key,
            max_inflight=args.max_inflight, max_queue=args.max_queue)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        print(f"sdcp-fast up: starting in {args.dir} (each service has {args.timeout:.0f} s: --timeout; its steps "
              f"in {Path(args.dir) / 'logs'}) ...", file=sys.stderr, flush=True)
        up.start(timeout=args.timeout)
        endpoints = up.endpoints()
        for name, svc in endpoints["services"].items():
            print(f"  {name:<17} {svc['role']:<9} {svc['url']}  (pid {svc['pid']})", flush=True)
        for url in endpoints["frontends"]:
            print(f"  front end         {url}  (OpenAI-compatible; API key {endpoints['api_key']})", flush=True)
        print(f"  tokenizer         {endpoints['tokenizer']}  (for load generators)", flush=True)
        print(f"sdcp-fast up: all healthy; endpoints in {Path(args.dir) / 'endpoints.json'}; Ctrl-C to stop",
              flush=True)
        while not stopping:
            for name in up.supervise_once():
                print(f"sdcp-fast up: {name} died; restarted", file=sys.stderr, flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError, ValueError) as exc:
        print(f"sdcp-fast up: {exc}", file=sys.stderr)
        return 1
    finally:
        up.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0
