"""A round-trip delay between simulated hosts (``sdcp-fast cluster up --rtt-ms X``), not
between a host and the machine's own namespace.

Where the kernel has ``sch_netem`` each host's ``eth0`` delays by X/2 what it sends to the
other hosts (a ``prio`` qdisc whose fourth band is a ``netem``, chosen by a ``u32`` filter on
the subnet; the bridge's own address stays in a band without delay). Where it has not (the
probe tries exactly that on a throwaway link), a relay in the root namespace carries every
packet between hosts and holds each for X/2:

- the bridge's ports are isolated, so a host's frames reach only the bridge's own interface;
- the bridge answers ARP for the other hosts (proxy ARP, no delay), so a host sends them
  there, to be forwarded by the root namespace (forwarding on the bridge and the tun only);
- a policy rule sends what comes in on the bridge for the subnet to a tun device, whose
  reader (:func:`serve`, a process of its own) writes each packet back after X/2; it comes
  in again from the tun and goes out on the bridge to its host.

Addresses, ports, base URIs, certificates and etcd's peer URLs are those of the hosts: only
the path between them changes, for every protocol and port (a Mooncake transfer engine's
too). The relay's tun is not persistent, so it goes with the relay's process; :func:`remove`
ends that process and deletes the policy rule.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from sdcp_fast.cluster.netns import NetnsError, Network, ip

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
RULE_PRIORITY = 1000  # before the main table (32766)


@dataclass(frozen=True)
class Delay:
    """What :func:`install` put in place: the round trip it adds, how (``none``, ``netem`` or
    ``relay``), and for the relay its process, tun device and routing table."""

    rtt_ms: float
    method: str
    relay_pid: int | None = None
    tun: str | None = None
    table: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rtt_ms": self.rtt_ms, "method": self.method, "relay_pid": self.relay_pid, "tun": self.tun,
                "table": self.table}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Delay:
        return cls(float(data["rtt_ms"]), str(data["method"]), data.get("relay_pid"), data.get("tun"),
                   data.get("table"))


def tun_name(net: Network) -> str:
    return f"st{net.tag}"


def table_of(net: Network) -> int:
    """A routing table per network: the tag is 6 hex digits, so two networks never share one."""
    return 0x10000000 + int(net.tag, 16)


def subnet_of(net: Network) -> str:
    import ipaddress

    return str(ipaddress.ip_interface(net.bridge_cidr).network)


def bridge_address(net: Network) -> str:
    return net.bridge_cidr.partition("/")[0]


def netem_commands(net: Network, netns: str, one_way_ms: float) -> list[list[str]]:
    """The ``tc`` commands that delay what namespace ``netns`` sends to the other hosts of
    ``net`` by ``one_way_ms``: band 4 of a ``prio`` (which its priomap never picks by itself)
    holds the netem; the bridge's address matches first and goes to band 1 undelayed."""
    delay = f"{one_way_ms:g}ms"
    tc = ["ip", "netns", "exec", netns, "tc"]
    return [[*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "prio", "bands", "4"],
            [*tc, "qdisc", "add", "dev", "eth0", "parent", "1:4", "handle", "40:", "netem", "delay", delay],
            [*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
             "match", "ip", "dst", f"{bridge_address(net)}/32", "flowid", "1:1"],
            [*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "2", "u32",
             "match", "ip", "dst", subnet_of(net), "flowid", "1:4"]]


def netem_works(net: Network) -> bool:
    """Whether :func:`netem_commands` succeed here, tried once on a throwaway namespace."""
    ns = f"sdcp-netem-probe-{os.getpid()}"
    made = ip("netns", "add", ns, check=False)
    if made.returncode != 0:
        return False
    try:
        ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1", check=False)
        ip("-n", ns, "link", "set", "eth0", "up", check=False)
        for argv in netem_commands(net, ns, 1.0):
            if subprocess.run(argv, capture_output=True, check=False).returncode != 0:
                return False
        return True
    finally:
        ip("netns", "del", ns, check=False)


def install(net: Network, rtt_ms: float, *, method: str | None = None, timeout: float = 30.0) -> Delay:
    """Add ``rtt_ms`` between the hosts of ``net`` (already up). ``method`` forces ``netem``
    or ``relay``; by default netem where :func:`netem_works`. Nothing is added for 0."""
    if rtt_ms < 0:
        raise ValueError(f"--rtt-ms must be 0 or more, not {rtt_ms:g}")
    if rtt_ms == 0:
        return Delay(0.0, "none")
    method = method or ("netem" if netem_works(net) else "relay")
    if method == "netem":
        for host, _ in net.hosts:
            for argv in netem_commands(net, net.netns(host), rtt_ms / 2):
                done = subprocess.run(argv, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return Delay(rtt_ms, "netem")
    if method != "relay":
        raise ValueError(f"unknown delay method {method!r} (netem, relay)")
    tun, table = tun_name(net), table_of(net)
    child = subprocess.Popen([sys.executable, "-m", "sdcp_fast.cluster.relay", "--tun", tun,
                              "--one-way-ms", repr(rtt_ms / 2)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    delay = Delay(rtt_ms, "relay", child.pid, tun, table)
    try:
        _wait_ready(child, timeout)
        ip("link", "set", tun, "up")
        for dev in (net.bridge, tun):
            _sysctl(f"net/ipv4/conf/{dev}/forwarding", "1")
            _sysctl(f"net/ipv4/conf/{dev}/send_redirects", "0")
        _sysctl(f"net/ipv4/conf/{tun}/rp_filter", "2")  # what the tun hands back has a host's source
        _sysctl(f"net/ipv4/conf/{net.bridge}/proxy_arp", "1")
        _sysctl(f"net/ipv4/neigh/{net.bridge}/proxy_delay", "0")  # else each answer waits up to 0.8 s
        ip("route", "add", subnet_of(net), "dev", tun, "table", str(table))
        ip("rule", "add", "iif", net.bridge, "lookup", str(table), "priority", str(RULE_PRIORITY))
        for host, _ in net.hosts:
            _isolate(net.veth(host))
    except BaseException:
        remove(net, delay)
        raise
    return delay


def _wait_ready(child: subprocess.Popen[bytes], timeout: float) -> None:
    assert child.stdout is not None and child.stderr is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    line = child.stdout.readline() if ready else b""
    if line.strip() != b"ready":
        child.kill()
        child.wait()
        err = child.stderr.read().decode(errors="replace").strip() or f"no answer in {timeout:g} s"
        raise NetnsError(f"the delay relay did not start: {err}")


def _isolate(port: str) -> None:
    done = subprocess.run(["bridge", "link", "set", "dev", port, "isolated", "on"], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"bridge link set dev {port} isolated on: {done.stderr.strip()}")


def _sysctl(key: str, value: str) -> None:
    with open(f"/proc/sys/{key}", "w") as f:
        f.write(value)


def remove(net: Network, delay: Delay) -> None:
    """Undo :func:`install` (what is already gone is skipped). netem goes with the namespaces."""
    if delay.method != "relay":
        return
    if delay.table is not None:
        while ip("rule", "del", "iif", net.bridge, "lookup", str(delay.table), check=False).returncode == 0:
            pass
    if delay.relay_pid and _is_relay(delay.relay_pid, delay.tun or ""):
        os.kill(delay.relay_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _is_relay(delay.relay_pid, delay.tun or "") and time.monotonic() < deadline:
            try:
                os.waitpid(delay.relay_pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)


def _is_relay(pid: int, tun: str) -> bool:
    """Whether ``pid`` is still this network's relay (not a recycled pid, not a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] == "Z":
                return False
    except OSError:
        return False
    return b"sdcp_fast.cluster.relay" in argv and tun.encode() in argv


def leftovers(net: Network, delay: Delay) -> list[str]:
    """What of :func:`install` still exists (empty after :func:`remove`)."""
    if delay.method != "relay":
        return []
    left = []
    rules = ip("rule", "show", check=False).stdout
    if delay.table is not None and f"lookup {delay.table}" in rules:
        left.append(f"ip rule lookup {delay.table}")
    if delay.relay_pid and _is_relay(delay.relay_pid, delay.tun or ""):
        left.append(f"relay pid {delay.relay_pid}")
    return left


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def serve(fd: int, one_way_s: float) -> None:
    """Hand every packet read from ``fd`` back to it ``one_way_s`` after it was read, in order.
    The wait is select's (microseconds), so that half a millisecond is half a millisecond."""
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    while True:
        timeout = None if not held else max(0.0, held[0][0] - time.monotonic())
        readable, _, _ = select.select([fd], [], [], timeout)
        if readable:
            due = time.monotonic() + one_way_s
            try:
                while True:
                    held.append((due, os.read(fd, 65536)))
            except BlockingIOError:
                pass
        now = time.monotonic()
        while held and held[0][0] <= now:
            try:
                os.write(fd, held.popleft()[1])
            except OSError:
                pass  # a packet the stack refused is lost, as on a wire


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the delaying relay between simulated hosts (see the module)")
    parser.add_argument("--tun", required=True)
    parser.add_argument("--one-way-ms", type=float, required=True)
    args = parser.parse_args(argv)
    fd = open_tun(args.tun)
    print("ready", flush=True)
    serve(fd, args.one_way_ms / 1000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
