"""bench/protocol.py across three simulated hosts (``python bench/protocol.py --hosts-rtt-ms 0
0.5 2``; root): rounds/s, p50 and p99 verdict latency, and the bytes the hosts send each
other per round, at each round-trip delay between hosts, beside one host measured in the
same run, with each figure's ratio to one host's.

The processes are bench/protocol.py's (an MLC, one verifier, ``--drafters`` drafters, this
bench as the router), placed as a cluster spreads them: h1 the router and the MLC (the
primary MLC of the default layout), h2 the verifier, h3 the drafters. Every round then
crosses hosts: the proposal (h3 to h2), the commit-log append (h2 to h1) and the router's
output poll (h1 to h2). The hosts are network namespaces on a bridge
(:class:`sdcp_fast.cluster.netns.Network`) with :func:`sdcp_fast.cluster.relay.install`'s
delay between them; the router runs inside h1, so what it sends is delayed too. The bytes
are what the hosts' ``eth0`` transmitted during the window (headers, TLS and TCP ACKs
included), read from ``/proc/<pid>/net/dev`` of a process in each host; one host has none.

    python bench/protocol.py --hosts-rtt-ms 0 0.5 2                          # ~3 min
    python bench/protocol.py --hosts-rtt-ms 0 2 --concurrency 1 --seconds 2  # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import protocol
from protocol import Router, throughput

from sdcp_fast.cluster import relay
from sdcp_fast.cluster.netns import Network, free_subnet, unavailable
from sdcp_fast.cluster.spec import PORTS, host_addresses
from sdcp_fast.protocol.peer import PeerRole
from sdcp_fast.transport.certs import InstanceSpec, write_certificates
from sdcp_fast.transport.loop import run

HOSTS = ("h1", "h2", "h3")
PLACES = {"router": "h1", "mlc": "h1", "verifier": "h2", "drafter": "h3"}


class Placed(protocol.Deployment):
    """bench/protocol.py's deployment with each process on its host: ``addresses`` and
    ``netns`` per host name (``netns`` empty: every process on this machine's loopback)."""

    def __init__(self, directory: Path, addresses: dict[str, str], netns: dict[str, str], drafters: int,
                 max_batch: int, batch_wait: float, threads: int) -> None:
        self.directory, self.certs = directory, directory / "certs"
        self.netns = netns
        one_host = not netns
        ports = [protocol.free_port() for _ in range(2 + drafters)] if one_host else [
            PORTS["mlc"], PORTS["verifier"], *(PORTS["drafter"] + i for i in range(drafters))]
        at = {role: addresses[host] for role, host in PLACES.items()}
        self.mlc = f"https://{at['mlc']}:{ports[0]}"
        self.verifier = f"https://{at['verifier']}:{ports[1]}/"
        self.drafters = [f"https://{at['drafter']}:{p}/" for p in ports[2:]]
        write_certificates(self.certs, [
            InstanceSpec("mlc", PeerRole.MLC, self.mlc + "/"), InstanceSpec("verifier", PeerRole.VERIFIER, self.verifier),
            InstanceSpec("router", PeerRole.ROUTER, f"https://{at['router']}:1/"),
            *(InstanceSpec(f"drafter-{i}", PeerRole.DRAFTER, uri) for i, uri in enumerate(self.drafters))])
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.processes["mlc"] = subprocess.Popen(
            [*self._on("mlc"), sys.executable, "-m", "sdcp_fast", "mlc", "--host", at["mlc"], "--port", str(ports[0]),
             "--root", str(directory / "mlc"), "--certs", str(self.certs), "--name", "mlc", "--max-open-logs", "2048"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        _wait_port(at["mlc"], ports[0])  # h1's, like this process
        names = [("verifier", "verifier", ports[1])] + [("drafter", f"drafter-{i}", p) for i, p in enumerate(ports[2:])]
        for kind, name, port in names:
            child = subprocess.Popen(
                [*self._on(kind), sys.executable, protocol.__file__, "--serve", kind, name, str(port), "--address",
                 at[kind], "--certs", str(self.certs), "--mlc", self.mlc, "--max-batch", str(max_batch),
                 "--batch-wait-ms", str(batch_wait * 1e3), "--threads", str(threads)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.processes[name] = child
            assert child.stdout is not None
            if child.stdout.readline().strip() != "READY":
                raise RuntimeError(f"{name} did not start")

    def _on(self, role: str) -> list[str]:
        """The prefix that runs a command on ``role``'s host (h1's is this process's own)."""
        host = PLACES[role]
        return [] if not self.netns or host == "h1" else ["ip", "netns", "exec", self.netns[host]]

    def sent_between_hosts(self) -> int:
        """Bytes the hosts' eth0 transmitted so far (0 on one host)."""
        if not self.netns:
            return 0
        pids = {"h1": os.getpid(), "h2": self.processes["verifier"].pid, "h3": self.processes["drafter-0"].pid}
        total = 0
        for pid in pids.values():
            for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
                name, _, counters = line.partition(":")
                if name.strip() == "eth0":
                    total += int(counters.split()[8])
        return total


class HostRouter(Router):
    """The router that reads the wire around its counters' exchanges, so that a window's bytes
    leave out the counters it reads at the window's ends."""

    def __init__(self, deployment: Placed) -> None:
        super().__init__(deployment)
        self.placed = deployment
        self.marks: list[tuple[int, int]] = []  # (before, after) each counters() call

    async def counters(self, drain: bool) -> dict[str, dict[str, Any]]:
        before = self.placed.sent_between_hosts()
        out = await super().counters(drain)
        self.marks.append((before, self.placed.sent_between_hosts()))
        return out


def _wait_port(address: str, port: int, timeout: float = 60.0) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {address}:{port}")


def measure(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The levels of ``plan`` on its placement (run on h1's host, or on this machine)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Placed(Path(tmp), plan["addresses"], plan["netns"], plan["drafters"], plan["max_batch"],
                   plan["batch_wait"], plan["threads"])
        try:
            router = HostRouter(d)

            async def levels() -> None:
                for concurrency in plan["concurrency"]:
                    for rule in plan["rules"]:
                        row = await throughput(router, rule, concurrency, plan["seconds"])
                        # throughput() reads the counters just before its window and at its end
                        window = router.marks[-1][0] - router.marks[-2][1]
                        row["bytes_between_hosts_per_round"] = window / max(row["rounds"], 1)
                        rows.append(row)
                await router.close()

            run(levels())
        finally:
            d.close()
    return rows


def _inner(plan_file: str) -> int:
    plan = json.loads(Path(plan_file).read_text())
    print(json.dumps(measure(plan)), flush=True)
    return 0


def _run_plan(plan: dict[str, Any], prefix: list[str]) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
    try:
        done = subprocess.run([*prefix, sys.executable, __file__, "--inner", f.name], capture_output=True, text=True,
                              timeout=1800)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"the measurement failed:\n{done.stderr[-3000:]}")
    rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def across_hosts(args: argparse.Namespace) -> int:
    why = unavailable()
    if why:
        print(f"bench/protocol.py --hosts-rtt-ms: {why}", file=sys.stderr)
        return 2
    plan: dict[str, Any] = {"concurrency": args.concurrency, "rules": args.rules, "seconds": args.seconds,
                            "drafters": args.drafters, "max_batch": args.max_batch,
                            "batch_wait": args.batch_wait_ms / 1e3, "threads": args.threads}
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.drafters} drafter processes; "
          f"h1 router + MLC, h2 verifier, h3 drafters", flush=True)
    result: dict[str, Any] = {"load_before": os.getloadavg(), "one_host": [], "hosts": {}}
    result["one_host"] = base = _run_plan({**plan, "addresses": dict.fromkeys(HOSTS, "127.0.0.1"), "netns": {}}, [])
    for row in base:
        _print("one host", row, row)
    for rtt in args.hosts_rtt_ms:
        bridge, addresses = host_addresses(len(HOSTS), free_subnet())
        net = Network(secrets.token_hex(3), f"{bridge}/24", tuple(zip(HOSTS, addresses, strict=True)))
        delay = relay.Delay(0.0, "none")
        try:
            net.up()
            delay = relay.install(net, rtt)
            rows = _run_plan({**plan, "addresses": dict(zip(HOSTS, addresses, strict=True)),
                              "netns": {h: net.netns(h) for h in HOSTS}}, net.exec_argv("h1", []))
        finally:
            relay.remove(net, delay)
            net.down()
        result["hosts"][str(rtt)] = {"method": delay.method, "levels": rows}
        for row, one in zip(rows, base, strict=True):
            _print(f"3 hosts rtt {rtt:g} ms ({delay.method})", row, one)
    result["load_after"] = os.getloadavg()
    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _print(label: str, row: dict[str, Any], one: dict[str, Any]) -> None:
    print(f"{label:28s} rule {row['rule']} concurrency {row['concurrency']:3d}: {row['rps']:6.0f} rounds/s "
          f"(x{row['rps'] / one['rps']:.2f})  p50 {row['p50_ms']:6.2f} ms (x{row['p50_ms'] / one['p50_ms']:.2f})  "
          f"p99 {row['p99_ms']:6.2f} ms (x{row['p99_ms'] / one['p99_ms']:.2f})  "
          f"{row['bytes_between_hosts_per_round']:6.0f} B between hosts per round", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inner"]:
        sys.exit(_inner(sys.argv[2]))
    sys.exit(protocol.main())
