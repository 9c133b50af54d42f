"""``sdcp-fast cluster`` and ``sdcp-fast node`` on what they refuse and what needs no hosts:
a spec's certificates for real machines, a host the spec does not name, simulated hosts
outside the benchmarking range, and ``down`` where nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdcp_fast.cli import main
from sdcp_fast.cluster.spec import default_layout


def test_certs_for_a_spec_then_a_node_for_a_host_it_does_not_name(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "cluster.toml"
    spec.write_text(default_layout(3).to_toml())
    assert main(["cluster", "certs", "--spec", str(spec), "--dir", str(tmp_path)]) == 0
    assert {"ca", "client", "router-h1", "verifier-h2", "drafter-h3", "mlc-h2"} <= {
        p.stem for p in (tmp_path / "certs").glob("*.pem")}
    assert main(["node", "--spec", str(spec), "--host", "h9"]) == 2
    assert "no host 'h9' in the spec (hosts: h1, h2, h3)" in capsys.readouterr().err


def test_simulated_hosts_live_in_the_benchmarking_range_only(tmp_path: Path, capsys) -> None:
    from .conftest import require_namespaces

    require_namespaces()
    spec = tmp_path / "cluster.toml"
    spec.write_text('[[host]]\nname = "a"\naddress = "10.9.8.7"\nroles = ["etcd"]\n')
    assert main(["cluster", "up", "--dir", str(tmp_path / "c"), "--spec", str(spec)]) == 1
    assert "simulated hosts live in 198.18.0.0/15, not at 10.9.8.7" in capsys.readouterr().err
    assert main(["cluster", "up", "--dir", str(tmp_path / "c"), "--subnet", "192.168.5.0/24"]) == 1
    assert "not 192.168.5.0/24" in capsys.readouterr().err
    spec.write_text('[[host]]\nname = "a"\naddress = "198.18.1.11"\n[[host]]\nname = "b"\naddress = "198.18.2.11"\n')
    assert main(["cluster", "up", "--dir", str(tmp_path / "c"), "--spec", str(spec)]) == 1
    assert "need addresses in one subnet of 198.18.0.0/15 (here 198.18.1.0/24" in capsys.readouterr().err
    assert not (tmp_path / "c" / "cluster.json").exists()


@pytest.mark.parametrize("made", [False, True])
def test_down_where_nothing_runs_is_done(tmp_path: Path, made: bool) -> None:
    if made:
        (tmp_path / "cluster.toml").write_text(default_layout(1).to_toml())
    assert main(["cluster", "down", "--dir", str(tmp_path)]) == 0
