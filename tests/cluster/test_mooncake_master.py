"""The cluster's Mooncake master in the spec and the commands (pure, fast): one host of the
default layout runs it, one that holds no verifier, and every MLC node is told to lend it a
segment and reach it at that host's address."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sdcp_fast.cli import mlc as mlc_cli
from sdcp_fast.cluster.host_part import role_argv
from sdcp_fast.cluster.mooncake_master import master_argv, mlc_args
from sdcp_fast.cluster.spec import default_layout, only, parse


def option(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_one_host_runs_the_master_one_without_a_verifier_where_there_is_one(n: int) -> None:
    spec = default_layout(n)
    [master] = spec.instances("mooncake-master")
    assert spec.mooncake_master() == master
    if any("verifier" not in h.roles for h in spec.hosts):
        assert "verifier" not in spec.host(master.host).roles
    assert master.uri == f"{master.address}:50051"
    assert parse(spec.to_toml()) == spec


def test_every_mlc_node_lends_the_master_a_segment_and_reaches_it_by_its_host_s_address(tmp_path: Path) -> None:
    spec = default_layout(3)
    master = spec.mooncake_master()
    assert master is not None and master.host == "h1"
    argv = master_argv(spec, master)
    assert Path(argv[0]).name == "mooncake_master"
    assert "--rpc_address=198.18.0.11" in argv and "--rpc_port=50051" in argv
    assert "--http_metadata_server_host=198.18.0.11" in argv and "--http_metadata_server_port=8080" in argv
    for mlc in spec.instances("mlc"):
        extra = mlc_args(spec, mlc)
        assert option(extra, "--mooncake-master") == ["198.18.0.11:50051"]
        assert option(extra, "--mooncake-metadata") == ["http://198.18.0.11:8080/metadata"]
        assert option(extra, "--mooncake-hostname") == [mlc.address]
        assert "--mooncake-attach-later" in extra, "a node started while the master is away attaches later"
        assert not set(extra) & set(role_argv(spec, mlc, tmp_path, "toy"))  # flags of their own
        parser = argparse.ArgumentParser()
        mlc_cli.add_arguments(parser)
        assert parser.parse_args(extra).mooncake_attach_later
    assert mlc_args(only(spec, ("etcd", "mlc")), spec.instances("mlc")[0]) == []


def test_a_spec_names_one_master_at_most() -> None:
    text = "".join(f'[[host]]\nname = "{n}"\naddress = "10.0.0.{i}"\nroles = ["mooncake-master"]\n'
                   for i, n in enumerate("ab", 1))
    with pytest.raises(ValueError, match="one mooncake-master"):
        parse(text)
