"""``sdcp-fast cluster up|down|status|certs``: simulated hosts on this machine, each a network
namespace on a bridge running ``sdcp-fast node`` (sdcp_fast/cluster/simulate.py); the
instances registered in a cluster's etcd; and the certificates of a cluster spec, for real
hosts."""

from __future__ import annotations

import argparse

HELP = ("simulated hosts (network namespaces, root only): cluster up, cluster down; cluster status (who is "
        "registered); cluster certs for a spec")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start N simulated hosts and run `sdcp-fast node` in each")
    up.add_argument("--dir", required=True, metavar="DIR", help="folder for the spec, certificates, logs, "
                                                                "cluster.json and endpoints.json")
    up.add_argument("--hosts", type=int, default=3, help="hosts of the default layout (default 3)")
    up.add_argument("--spec", metavar="FILE", help="a cluster spec instead of the default layout (its addresses "
                                                   "must lie in 198.18.0.0/15)")
    up.add_argument("--model", default="auto", help="the target model: toy, smollm2, auto (default)")
    up.add_argument("--subnet", default=None, help="the hosts' subnet, inside 198.18.0.0/15 (default 198.18.0.0/24; "
                                                   "a --spec's hosts share the /24 of its first host)")
    up.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for every host (default 240)")
    up.add_argument("--rtt-ms", type=float, default=0.0, metavar="X",
                    help="round-trip delay between hosts, not to this machine's own namespace (tc netem where "
                         "the kernel has it, else a delaying relay on the bridge; cluster.json says which)")
    down = sub.add_parser("down", help="stop the hosts and remove their namespaces, links and bridge")
    down.add_argument("--dir", required=True, metavar="DIR")
    status = sub.add_parser("status", help="the instances registered in the cluster's etcd (JSON)")
    status.add_argument("--dir", required=True, metavar="DIR", help="a folder with cluster.toml")
    certs = sub.add_parser("certs", help="a CA and every instance's certificate for a cluster spec")
    certs.add_argument("--spec", required=True, metavar="FILE")
    certs.add_argument("--dir", required=True, metavar="DIR", help="certificates go into DIR/certs")


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from sdcp_fast.cluster import simulate
    from sdcp_fast.cluster.netns import NetnsError, unavailable
    from sdcp_fast.cluster.spec import BENCHMARK_RANGE, DEFAULT_SUBNET, load

    directory = Path(args.dir)
    try:
        if args.action == "certs":
            from sdcp_fast.cluster.host_part import write_cluster_certificates

            write_cluster_certificates(load(args.spec), directory / "certs")
            print(f"certificates in {directory / 'certs'}")
            return 0
        if args.action == "status":
            from dataclasses import asdict

            from sdcp_fast.cluster.membership_etcd import Membership

            spec = load(directory / "cluster.toml")
            membership = Membership(spec.token, spec.etcd_clients(), timeout=2)
            try:
                print(json.dumps([asdict(m) for m in membership.members()], indent=1))
            finally:
                membership.close()
            return 0
        if args.action == "down":
            left = simulate.down(directory)
            if left:
                print(f"sdcp-fast cluster down: still there: {', '.join(left)}", file=sys.stderr)
                return 1
            return 0
        why = unavailable()
        if why:
            print(f"sdcp-fast cluster up: {why}", file=sys.stderr)
            return 2
        import ipaddress

        if args.spec:
            spec = load(args.spec)
            outside = [h.address for h in spec.hosts if ipaddress.ip_address(h.address) not in BENCHMARK_RANGE]
            if outside:
                raise ValueError(f"simulated hosts live in {BENCHMARK_RANGE}, not at {', '.join(outside)}")
        else:
            spec = simulate.default_spec(args.hosts, args.subnet or DEFAULT_SUBNET, args.model)
        prefix_len = ipaddress.ip_network(args.subnet).prefixlen if args.subnet and not args.spec else 24
        endpoints = simulate.up(directory, spec, prefix_len=prefix_len, timeout=args.timeout, rtt_ms=args.rtt_ms)
    except (ValueError, OSError, NetnsError, RuntimeError, TimeoutError) as exc:  # EtcdError is a RuntimeError
        print(f"sdcp-fast cluster {args.action}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(endpoints, indent=1))
    return 0
