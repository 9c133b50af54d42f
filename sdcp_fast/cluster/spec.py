"""The cluster spec: the hosts, their addresses and what runs on each, as one TOML file that
``sdcp-fast node`` reads on every host and ``sdcp-fast cluster up`` writes for simulated ones.

::

    model = "toy"
    scope = "<32 hex digits>"      # the routers' shared scope (their routing records)
    token = "sdcp-..."             # the etcd cluster's token
    lease_ttl_s = 5                # the membership leases (registry)
    [[host]]
    name = "h1"
    address = "198.18.0.11"
    roles = ["etcd", "mlc", "router", "drafter"]

Every instance listens on its host's address at its role's port (``PORTS``; the ``[ports]``
table overrides them), so the ports are the same on every host. Instances are named
``<role>-<host>``; the MLC the roles share is the first host's (``primary_mlc``). One host may
run the cluster's ``mooncake-master`` (sdcp_fast/cluster/mooncake_master.py): every MLC node
then lends Mooncake Store a segment and keeps there what must outlive its host.
"""

from __future__ import annotations

import ipaddress
import secrets
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROLES = ("etcd", "mlc", "router", "verifier", "drafter", "mooncake-master")
# The processes that speak no SDCP: no certificate, no registration in the membership registry.
NOT_SDCP = frozenset({"etcd", "mooncake-master"})
PORTS = {"etcd": 2379, "etcd-peer": 2380, "mlc": 8470, "router": 8500, "api": 8000, "verifier": 8600,
         "drafter": 8700, "mooncake-master": 50051, "mooncake-metadata": 8080, "mooncake-metrics": 9003}
# The benchmarking range (RFC 2544): the project's own simulated hosts, never anyone else's.
DEFAULT_SUBNET = "198.18.0.0/24"
BENCHMARK_RANGE = ipaddress.ip_network("198.18.0.0/15")


@dataclass(frozen=True)
class HostSpec:
    name: str
    address: str
    roles: tuple[str, ...]


@dataclass(frozen=True)
class Instance:
    """One process the spec places: role, name, host, and where it listens."""

    role: str
    name: str
    host: str
    address: str
    port: int

    @property
    def uri(self) -> str:
        """Its SDCP base URI (the MLC's without the trailing slash, as its clients take it); a
        Mooncake master's RPC address, ``host:port``."""
        if self.role == "mooncake-master":
            return f"{self.address}:{self.port}"
        base = f"https://{self.address}:{self.port}"
        return base if self.role == "mlc" else base + "/"


@dataclass(frozen=True)
class ClusterSpec:
    hosts: tuple[HostSpec, ...]
    model: str = "toy"
    drafters: tuple[str, ...] = ()  # the drafters' kinds in the order they appear; () the model's defaults
    scope: str = field(default_factory=lambda: secrets.token_hex(16))
    token: str = field(default_factory=lambda: "sdcp-" + secrets.token_hex(8))
    lease_ttl_s: int = 5
    ports: dict[str, int] = field(default_factory=lambda: dict(PORTS))

    def __post_init__(self) -> None:
        names = [h.name for h in self.hosts]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"hosts must be named once each: {names}")
        for h in self.hosts:
            ipaddress.ip_address(h.address)  # ValueError names it
            unknown = set(h.roles) - set(ROLES)
            if unknown:
                raise ValueError(f"host {h.name}: unknown roles {sorted(unknown)} (known: {', '.join(ROLES)})")
        if len({h.address for h in self.hosts}) != len(self.hosts):
            raise ValueError("two hosts share an address")
        if self.lease_ttl_s < 2:
            raise ValueError("lease_ttl_s must be at least 2 (leases are renewed every third of it)")
        self.mooncake_master()  # at most one

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ValueError(f"no host {name!r} in the spec (hosts: {', '.join(h.name for h in self.hosts)})")

    def host_at(self, uri: str) -> str:
        """The name of the host whose address ``uri`` names."""
        address = urlsplit(uri).hostname
        return next(h.name for h in self.hosts if h.address == address)

    def instances(self, role: str | None = None) -> list[Instance]:
        """Every instance, host by host; ``role``'s only if given."""
        return [Instance(r, f"{r}-{h.name}", h.name, h.address, self.ports[r])
                for h in self.hosts for r in h.roles if role in (None, r)]

    def etcd_peers(self) -> str:
        """``--initial-cluster`` of the etcd members."""
        return ",".join(f"etcd-{h.name}=http://{h.address}:{self.ports['etcd-peer']}"
                        for h in self.hosts if "etcd" in h.roles)

    def etcd_clients(self) -> list[tuple[str, int]]:
        return [(i.address, i.port) for i in self.instances("etcd")]

    def primary_mlc(self) -> Instance:
        mlcs = self.instances("mlc")
        if not mlcs:
            raise ValueError("no host runs an MLC")
        return mlcs[0]

    def mooncake_master(self) -> Instance | None:
        masters = self.instances("mooncake-master")
        if len(masters) > 1:
            raise ValueError(f"one mooncake-master per cluster, not {len(masters)}")
        return masters[0] if masters else None

    def drafter_kinds(self, defaults: tuple[str, ...]) -> dict[str, str]:
        """Each drafter instance's kind: the spec's list in order, else ``defaults``, cycled."""
        kinds = self.drafters or defaults
        return {i.name: kinds[n % len(kinds)] for n, i in enumerate(self.instances("drafter"))}

    def to_toml(self) -> str:
        lines = [f"model = {_quote(self.model)}", f"scope = {_quote(self.scope)}", f"token = {_quote(self.token)}",
                 f"lease_ttl_s = {self.lease_ttl_s}"]
        if self.drafters:
            lines.append(f"drafters = [{', '.join(_quote(d) for d in self.drafters)}]")
        for h in self.hosts:
            lines += ["", "[[host]]", f"name = {_quote(h.name)}", f"address = {_quote(h.address)}",
                      f"roles = [{', '.join(_quote(r) for r in h.roles)}]"]
        if self.ports != PORTS:
            lines += ["", "[ports]", *(f"{_quote(k)} = {v}" for k, v in sorted(self.ports.items()))]
        return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    if any(c in text for c in '"\\\n'):
        raise ValueError(f"not a plain TOML string: {text!r}")
    return f'"{text}"'


def parse(text: str) -> ClusterSpec:
    """A spec from its TOML text (ValueError says what is wrong)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the same parser as its own distribution, where the standard library has none
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ValueError("reading a cluster spec on Python 3.10 needs the tomli package") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"cluster spec: {exc}") from None
    hosts = tuple(HostSpec(str(h["name"]), str(h["address"]), tuple(str(r) for r in h.get("roles", ())))
                  for h in _list(data, "host"))
    extra: dict[str, Any] = {}
    for key in ("scope", "token"):
        if key in data:
            extra[key] = str(data[key])
    ports = {**PORTS, **{str(k): int(v) for k, v in data.get("ports", {}).items()}}
    unknown = set(data) - {"model", "drafters", "scope", "token", "lease_ttl_s", "host", "ports"}
    if unknown:
        raise ValueError(f"cluster spec: unknown keys {sorted(unknown)}")
    return ClusterSpec(hosts, model=str(data.get("model", "toy")),
                       drafters=tuple(str(d) for d in data.get("drafters", ())),
                       lease_ttl_s=int(data.get("lease_ttl_s", 5)), ports=ports, **extra)


def _list(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ValueError(f"cluster spec: [[{key}]] must be tables")
    return value


def load(path: str | Path) -> ClusterSpec:
    return parse(Path(path).read_text())


def host_addresses(n: int, subnet: str = DEFAULT_SUBNET) -> tuple[str, list[str]]:
    """The bridge's address (.1) and ``n`` hosts' (.11, .12, ...) in ``subnet``, which must
    lie in the benchmarking range."""
    net = ipaddress.ip_network(subnet)
    if not net.subnet_of(BENCHMARK_RANGE):  # type: ignore[arg-type]
        raise ValueError(f"simulated hosts live in {BENCHMARK_RANGE}, not {subnet}")
    if not 1 <= n <= net.num_addresses - 12:
        raise ValueError(f"{n} hosts do not fit in {subnet}")
    return str(net.network_address + 1), [str(net.network_address + 11 + i) for i in range(n)]


def default_layout(n: int = 3, *, subnet: str = DEFAULT_SUBNET, model: str = "toy") -> ClusterSpec:
    """``n`` hosts, each with an etcd member and an MLC node; routers (with their front ends)
    on the first two, verifiers on the second and third, drafters on the third and first, so
    with three hosts each role is on two of them and no host holds everything. Hosts past the
    third add a verifier (even) or a drafter (odd). The Mooncake master runs on the first host
that holds no verifier (the first host where each holds one), so losing a verifier's host and
losing the store's master are separate faults."""
    _, addresses = host_addresses(n, subnet)
    hosts = []
    for i, address in enumerate(addresses):
        roles = ["etcd", "mlc"]
        if i in {0, 1 % n}:
            roles.append("router")
        if i in {1 % n, 2 % n} or (i >= 3 and i % 2 == 1):
            roles.append("verifier")
        if i in {2 % n, 0} or (i >= 3 and i % 2 == 0):
            roles.append("drafter")
        hosts.append(HostSpec(f"h{i + 1}", address, tuple(roles)))
    master = next((i for i, h in enumerate(hosts) if "verifier" not in h.roles), 0)
    hosts[master] = replace(hosts[master], roles=(*hosts[master].roles, "mooncake-master"))
    return ClusterSpec(tuple(hosts), model=model)


def only(spec: ClusterSpec, roles: tuple[str, ...]) -> ClusterSpec:
    """``spec`` with each host keeping only ``roles`` of its own (e.g. just etcd)."""
    return replace(spec, hosts=tuple(replace(h, roles=tuple(r for r in h.roles if r in roles)) for h in spec.hosts))
