"""The cluster spec and its default layout (pure, no I/O)."""

from __future__ import annotations

import pytest

from sdcp_fast.cluster.spec import PORTS, ClusterSpec, HostSpec, default_layout, host_addresses, only, parse


def test_the_default_layout_of_three_puts_each_role_on_two_hosts_and_everything_on_none() -> None:
    spec = default_layout(3)
    roles = {h.name: set(h.roles) for h in spec.hosts}
    assert [h.address for h in spec.hosts] == ["198.18.0.11", "198.18.0.12", "198.18.0.13"]
    for role in ("router", "verifier", "drafter"):
        assert sum(role in r for r in roles.values()) == 2, role
    assert all({"etcd", "mlc"} <= r for r in roles.values())
    assert not any({"router", "verifier", "drafter"} <= r for r in roles.values())


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_every_layout_has_each_role_and_an_etcd_member_and_mlc_per_host(n: int) -> None:
    spec = default_layout(n)
    assert len(spec.hosts) == n
    for role in ("router", "verifier", "drafter"):
        assert spec.instances(role), role
    assert len(spec.instances("etcd")) == len(spec.instances("mlc")) == n


def test_a_spec_reads_back_from_its_toml() -> None:
    spec = default_layout(3, subnet="198.19.7.0/24", model="smollm2")
    again = parse(spec.to_toml())
    assert again == spec
    assert again.etcd_peers() == ("etcd-h1=http://198.19.7.11:2380,etcd-h2=http://198.19.7.12:2380,"
                                  "etcd-h3=http://198.19.7.13:2380")
    assert [i.uri for i in again.instances("router")] == ["https://198.19.7.11:8500/", "https://198.19.7.12:8500/"]
    assert again.primary_mlc().uri == "https://198.19.7.11:8470"


def test_ports_and_drafter_kinds_come_from_the_spec() -> None:
    spec = parse('model = "toy"\ndrafters = ["ngram"]\n[[host]]\nname = "a"\naddress = "10.1.2.3"\n'
                 'roles = ["mlc", "drafter"]\n[[host]]\nname = "b"\naddress = "10.1.2.4"\nroles = ["drafter"]\n'
                 '[ports]\ndrafter = 9000\n')
    assert spec.ports == {**PORTS, "drafter": 9000}
    assert [i.uri for i in spec.instances("drafter")] == ["https://10.1.2.3:9000/", "https://10.1.2.4:9000/"]
    assert spec.drafter_kinds(("x", "y")) == {"drafter-a": "ngram", "drafter-b": "ngram"}
    assert parse(spec.to_toml()) == spec
    assert default_layout(3).drafter_kinds(("x", "y")) == {"drafter-h1": "x", "drafter-h3": "y"}


@pytest.mark.parametrize(("text", "says"), [
    ('[[host]]\nname = "a"\naddress = "10.0.0.1"\nroles = ["oracle"]\n', "unknown roles"),
    ('[[host]]\nname = "a"\naddress = "nowhere"\n', "does not appear to be an IPv4 or IPv6 address"),
    ('[[host]]\nname = "a"\naddress = "10.0.0.1"\n[[host]]\nname = "a"\naddress = "10.0.0.2"\n', "named once"),
    ('[[host]]\nname = "a"\naddress = "10.0.0.1"\n[[host]]\nname = "b"\naddress = "10.0.0.1"\n', "share an address"),
    ('colour = "blue"\n[[host]]\nname = "a"\naddress = "10.0.0.1"\n', "unknown keys"),
    ('[[host]\n', "cluster spec"),
    ("", "named once"),
])
def test_a_wrong_spec_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse(text)


def test_simulated_hosts_stay_in_the_benchmarking_range() -> None:
    assert host_addresses(2, "198.19.255.0/24") == ("198.19.255.1", ["198.19.255.11", "198.19.255.12"])
    with pytest.raises(ValueError, match="198.18.0.0/15"):
        host_addresses(3, "10.0.0.0/24")
    with pytest.raises(ValueError, match="do not fit"):
        host_addresses(300, "198.18.0.0/24")


def test_a_host_keeps_only_the_roles_asked_for() -> None:
    full = default_layout(3)
    spec = only(full, ("etcd",))
    assert [h.roles for h in spec.hosts] == [("etcd",)] * 3
    assert (spec.scope, spec.token) == (full.scope, full.token)
    with pytest.raises(ValueError, match="no host 'h9'"):
        spec.host("h9")
    with pytest.raises(ValueError, match="no host runs an MLC"):
        spec.primary_mlc()
    with pytest.raises(ValueError, match="lease_ttl_s"):
        ClusterSpec((HostSpec("a", "10.0.0.1", ()),), lease_ttl_s=1)
