"""Simulated hosts: Linux network namespaces on a bridge, made and removed with ``ip``
(iproute2; needs root).

Each host is a namespace holding ``lo`` and one end of a veth pair, renamed ``eth0`` and
given the host's address; the other end is a port of a bridge in the root namespace, which
holds the subnet's first address, so the machine's own namespace reaches every host and
the hosts reach each other over real TCP. No default route is set: a host reaches its
subnet and nothing else. Interface names carry the network's tag, so that two networks
(two test runs) never collide; they must use two subnets too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass


class NetnsError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can): no ``ip``, or not root, or
    the kernel refuses one."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing: scripts/services.sh installs it"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"sdcp-probe-{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Network:
    """The names of one simulated network: ``tag`` (a few hex digits, unique per network),
    the bridge's address with its prefix length, and the hosts (name, address)."""

    tag: str
    bridge_cidr: str  # e.g. 198.18.0.1/24
    hosts: tuple[tuple[str, str], ...]

    @property
    def bridge(self) -> str:
        return f"sb{self.tag}"  # interface names hold 15 bytes at most

    @property
    def prefix_len(self) -> str:
        return self.bridge_cidr.rpartition("/")[2]

    def netns(self, host: str) -> str:
        return f"sdcp-{self.tag}-{host}"

    def veth(self, host: str) -> str:
        """The root namespace's end of ``host``'s link."""
        index = [h for h, _ in self.hosts].index(host)
        return f"sv{self.tag}x{index}"

    def up(self) -> None:
        """Make the bridge, the namespaces and their links (removing what was made where a step
        fails). A subnet that an interface here already has is refused: two bridges holding one
        subnet would split its traffic between two networks."""
        import ipaddress

        subnet = str(ipaddress.ip_interface(self.bridge_cidr).network)
        if subnet in used_subnets():
            raise NetnsError(f"{subnet} is in use here (another simulated cluster?): choose another subnet")
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", self.bridge_cidr, "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for host, address in self.hosts:
                ns, outer = self.netns(host), self.veth(host)
                ip("netns", "add", ns)
                ip("-n", ns, "link", "set", "lo", "up")
                ip("link", "add", outer, "type", "veth", "peer", "name", f"{outer}i", "netns", ns)
                ip("-n", ns, "link", "set", f"{outer}i", "name", "eth0")
                ip("-n", ns, "addr", "add", f"{address}/{self.prefix_len}", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                ip("link", "set", outer, "master", self.bridge)
                ip("link", "set", outer, "up")
        except NetnsError:
            self.down()
            raise

    def cut_off(self, host: str) -> None:
        """Take ``host``'s link down at both ends: its processes run on, unreachable."""
        ip("link", "set", self.veth(host), "down")
        ip("-n", self.netns(host), "link", "set", "eth0", "down")

    def restore(self, host: str) -> None:
        ip("-n", self.netns(host), "link", "set", "eth0", "up")
        ip("link", "set", self.veth(host), "up")

    def pids(self, host: str) -> list[int]:
        """Every process in ``host``'s namespace."""
        done = ip("netns", "pids", self.netns(host), check=False)
        return [int(p) for p in done.stdout.split()]

    def kill(self, host: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every process of ``host`` (a host's death, with -9)."""
        for pid in self.pids(host):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def down(self, grace: float = 10.0) -> None:
        """Stop every process of every host (TERM, then KILL after ``grace`` seconds), then
        remove the namespaces, the links and the bridge. What is already gone is skipped."""
        present = set(namespaces())
        hosts = [h for h, _ in self.hosts if self.netns(h) in present]
        for host in hosts:
            self.kill(host, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(self.pids(h) for h in hosts) and time.monotonic() < deadline:
            time.sleep(0.1)
        for host in hosts:
            self.kill(host, signal.SIGKILL)
        deadline = time.monotonic() + grace
        while any(self.pids(h) for h in hosts) and time.monotonic() < deadline:
            time.sleep(0.1)
        for host, _ in self.hosts:
            ip("link", "del", self.veth(host), check=False)  # takes its peer with it
            if host in hosts:
                ip("netns", "del", self.netns(host), check=False)
        ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        """What of this network still exists (empty once :meth:`down` is done)."""
        present = set(namespaces())
        links = set(link_names())
        return sorted({self.netns(h) for h, _ in self.hosts} & present) + sorted(
            ({self.bridge} | {self.veth(h) for h, _ in self.hosts}) & links)

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.netns(host), *argv]


def namespaces() -> list[str]:
    done = ip("netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def link_names() -> list[str]:
    done = ip("-o", "link", "show", check=False)
    return [line.split(":")[1].strip().partition("@")[0] for line in done.stdout.splitlines() if ":" in line]


def used_subnets() -> set[str]:
    """The IPv4 networks configured on the root namespace's interfaces."""
    import ipaddress

    done = ip("-o", "-4", "addr", "show", check=False)
    found = set()
    for line in done.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            found.add(str(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network))
    return found


def free_subnet() -> str:
    """A /24 of the benchmarking range (198.18.0.0/15) that no interface here uses, picked at
    random so that two runs starting together rarely try the same one."""
    import random

    used = used_subnets()
    candidates = [f"198.{18 + i // 256}.{i % 256}.0/24" for i in range(512)]
    random.shuffle(candidates)
    for subnet in candidates:
        if subnet not in used:
            return subnet
    raise NetnsError("every /24 of 198.18.0.0/15 is in use")
