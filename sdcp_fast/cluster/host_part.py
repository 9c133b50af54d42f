"""One host's part of a cluster (``sdcp-fast node``): its etcd member, its MLC node and its
roles, each its own process, started the way ``sdcp-fast up`` starts them
(:class:`~sdcp_fast.deploy.up.Up`'s launch, health check and stop), then registered in etcd
and kept registered until the node stops.

The folder ``directory`` holds ``certs/`` (one CA for the cluster, a certificate per
instance: :func:`write_cluster_certificates`) and gets ``logs/<instance>.log`` and
``<host>/`` (etcd's data, the MLC's root, ``node.json``: what runs here, written once
every instance answers and is registered).

Every service listens on all of the host's addresses at its role's port (on a simulated
host those are its own ``lo`` and ``eth0`` only); peers reach it at its base URI, which
names the host's address. The roles use their own host's MLC node for the objects they write,
and read an object that names another node there (sdcp_fast/store/nodes.py); the
routers discover verifiers and drafters from etcd's membership registry and keep routing
records and commit logs in etcd (sdcp_fast/cluster/discovery.py, etcd_records.py).
Membership: each instance is put under a lease of its own that the node renews every third
of ``lease_ttl_s``; an instance that exits has its lease revoked and is started again, and
a lease etcd let expire (the host was cut off for longer than the ttl) is replaced once etcd
answers again.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from sdcp_fast.cluster.membership import Member, cert_digest
from sdcp_fast.cluster.membership_etcd import Membership
from sdcp_fast.cluster.mooncake_master import MASTER_WAIT_S, master_argv, mlc_args
from sdcp_fast.cluster.spec import NOT_SDCP, ClusterSpec, Instance
from sdcp_fast.commitlog.etcd import EtcdError
from sdcp_fast.deploy.up import REAL_DRAFTERS, TOY_DRAFTERS, Service, Up

log = logging.getLogger("sdcp_fast.node")

STATUS_TTL_MS = 3000


def write_cluster_certificates(spec: ClusterSpec, certs: Path) -> None:
    """One CA (reused where ``certs`` has one) and a certificate per instance of the spec
    (etcd members and the Mooncake master excepted: they speak no SDCP) plus
    ``client``. Each names its base URI, its host's address and its host's name as SANs."""
    from sdcp_fast.protocol.peer import PeerRole
    from sdcp_fast.transport.certs import InstanceSpec, write_certificates

    specs = [InstanceSpec(i.name, PeerRole(i.role), i.uri if i.role != "mlc" else i.uri + "/", (i.host,))
             for i in spec.instances() if i.role not in NOT_SDCP]
    specs.append(InstanceSpec("client", PeerRole.CLIENT, None))
    write_certificates(certs, specs)


def etcd_argv(spec: ClusterSpec, me: Instance, data: Path) -> list[str]:
    client, peer = spec.ports["etcd"], spec.ports["etcd-peer"]
    return ["etcd", "--name", me.name, "--data-dir", str(data),
            "--listen-client-urls", f"http://{me.address}:{client},http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://{me.address}:{client}",
            "--listen-peer-urls", f"http://{me.address}:{peer}",
            "--initial-advertise-peer-urls", f"http://{me.address}:{peer}",
            "--initial-cluster", spec.etcd_peers(), "--initial-cluster-token", spec.token,
            "--initial-cluster-state", "new", "--log-level", "warn"]


def role_argv(spec: ClusterSpec, me: Instance, directory: Path, model: str) -> list[str]:
    """The command of one MLC node or role, as ``sdcp-fast up`` gives it, on this host."""
    py = [sys.executable, "-m", "sdcp_fast"]
    certs = str(directory / "certs")
    listen = f"0.0.0.0:{me.port}"
    if me.role == "mlc":
        return [*py, "mlc", "--host", "0.0.0.0", "--port", str(me.port), "--root", str(directory / me.host / "mlc"),
                "--certs", certs, "--name", me.name]
    cluster = ["--etcd", etcd_endpoints(spec, me), "--cluster", spec.token]
    common = ["--uri", me.uri, "--listen", listen, "--name", me.name, "--model", model, "--certs", certs,
              "--mlc", home_mlc(spec, me).uri, "--status-ttl-ms", str(STATUS_TTL_MS)]
    kinds = spec.drafter_kinds(TOY_DRAFTERS if model == "toy" else REAL_DRAFTERS)
    routers = ",".join(i.uri for i in spec.instances("router"))
    if me.role == "router":
        return [*py, "router", *common, "--api-listen", f"{me.address}:{spec.ports['api']}",
                "--api-key-file", str(directory / "certs" / "api-key"), "--scope", spec.scope, *cluster]
    if me.role == "verifier":
        return [*py, "verifier", *common, *cluster, "--router", routers]
    if me.role == "drafter":
        return [*py, "drafter", *common, *cluster, "--router", routers, "--drafter", kinds[me.name], "--threads", "1"]
    raise ValueError(f"no command for role {me.role!r}")


def home_mlc(spec: ClusterSpec, me: Instance) -> Instance:
    """The MLC node of ``me``'s roles: its own host's, the first host's where it has none. A
    role writes there and reads objects that name another node at that node
    (sdcp_fast/store/nodes.py)."""
    return next((i for i in spec.instances("mlc") if i.host == me.host), None) or spec.primary_mlc()


def etcd_endpoints(spec: ClusterSpec, me: Instance) -> str:
    """The etcd members as a role on ``me``'s host reaches them: its host's own first."""
    here = [f"127.0.0.1:{spec.ports['etcd']}"] if any(i.host == me.host for i in spec.instances("etcd")) else []
    return ",".join([*here, *(f"{h}:{p}" for h, p in spec.etcd_clients())])


class Node:
    def __init__(self, spec: ClusterSpec, host: str, directory: Path) -> None:
        self.spec, self.host = spec, spec.host(host)
        self.directory = directory
        self.up = Up(directory)  # its launch, health check and stop; its services are ours
        self.mine = [i for i in spec.instances() if i.host == host]
        self.leases: dict[str, str] = {}
        self.stopping = threading.Event()
        self.membership: Membership | None = None
        self.kinds: dict[str, str] = {}  # each drafter's kind, registered with it

    @property
    def state_file(self) -> Path:
        return self.directory / self.host.name / "node.json"

    def start(self, timeout: float = 180.0) -> None:
        from sdcp_fast.deploy.catalog import resolve

        model = resolve(self.spec.model)
        self.kinds = self.spec.drafter_kinds(TOY_DRAFTERS if model == "toy" else REAL_DRAFTERS)
        (self.directory / self.host.name).mkdir(parents=True, exist_ok=True)
        self.state_file.unlink(missing_ok=True)
        for i in self.mine:
            if i.role not in NOT_SDCP and not (self.directory / "certs" / f"{i.name}.pem").exists():
                raise FileNotFoundError(f"no certificate for {i.name} in {self.directory / 'certs'} "
                                        "(sdcp-fast cluster certs --spec FILE --dir DIR makes them)")
        deadline = time.monotonic() + timeout
        for i in self.mine:
            if i.role == "etcd":
                argv = etcd_argv(self.spec, i, self.directory / self.host.name / "etcd")
            elif i.role == "mooncake-master":
                argv = master_argv(self.spec, i)
            else:  # an MLC node lends the cluster's Mooncake Store a segment, where there is one
                argv = role_argv(self.spec, i, self.directory, model) + (mlc_args(self.spec, i) if i.role == "mlc"
                                                                         else [])
            self.up.services[i.name] = Service(i.name, i.role, i.port, argv)
        for i in self.mine:
            if i.role in NOT_SDCP:
                self.launch(i)
        self.wait_etcd(deadline)
        self.membership = Membership(self.spec.token, [("127.0.0.1", self.spec.ports["etcd"])]
                                     if any(i.role == "etcd" for i in self.mine) else self.spec.etcd_clients())
        master = self.spec.mooncake_master()
        if master is not None and any(i.role == "mlc" for i in self.mine):
            # A master that is away is attached to later (mlc_args); the wait spares a cluster
            # starting all at once its first objects kept outside the store.
            try:
                wait_port(master.address, master.port, min(deadline, time.monotonic() + MASTER_WAIT_S))
            except TimeoutError:
                log.warning("%s: no Mooncake master at %s; the MLC node starts without the store",
                            self.host.name, master.uri)
        for i in self.mine:
            if i.role == "mlc":
                self.launch(i)
        self.up.wait_healthy([i.name for i in self.mine if i.role == "mlc"], max(1.0, deadline - time.monotonic()))
        roles = [i for i in self.mine if i.role not in NOT_SDCP | {"mlc"}]
        if roles:  # they need their MLC node from their start
            home = home_mlc(self.spec, roles[0])
            wait_port(home.address, home.port, deadline)
        for i in roles:
            self.launch(i)
        self.up.wait_healthy([i.name for i in roles], max(1.0, deadline - time.monotonic()))
        for i in self.mine:
            if i.role not in NOT_SDCP:
                self.register(i)
        self.write_state()

    def launch(self, i: Instance) -> None:
        self.up.launch(self.up.services[i.name])

    def wait_etcd(self, deadline: float) -> None:
        """Until this host's member answers healthy (which needs a quorum of the members)."""
        if not any(i.role == "etcd" for i in self.mine):
            return
        url = f"http://127.0.0.1:{self.spec.ports['etcd']}/health"
        svc = self.up.services[f"etcd-{self.host.name}"]
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if json.loads(r.read()).get("health") in ("true", True):
                        return
            except (OSError, ValueError):
                pass
            assert svc.process is not None
            if svc.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {svc.process.returncode} (log {svc.log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd on {self.host.name} not healthy (no quorum?); log {svc.log_path}")
            time.sleep(0.2)

    def member(self, i: Instance) -> Member:
        pem = (self.directory / "certs" / f"{i.name}.pem").read_bytes()
        return Member(i.role, i.name, i.host, i.uri, cert_digest(pem), self.kinds.get(i.name, ""))

    def register(self, i: Instance) -> None:
        assert self.membership is not None
        lease = self.membership.grant(self.spec.lease_ttl_s)
        self.membership.register(self.member(i), lease)
        self.leases[i.name] = lease

    def state(self) -> dict[str, Any]:
        processes = []
        for i in self.mine:
            svc = self.up.services[i.name]
            uri = f"http://{i.address}:{i.port}" if i.role == "etcd" else i.uri  # the master's: host:port
            processes.append({"role": i.role, "name": i.name, "pid": svc.process.pid if svc.process else None,
                              "uri": uri})
        return {"host": self.host.name, "address": self.host.address, "node_pid": os.getpid(),
                "processes": processes}

    def write_state(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state(), indent=1) + "\n")
        tmp.replace(self.state_file)

    def tend(self) -> None:
        """One pass of the keeper: restart what exited (its lease revoked first), renew the
        leases, re-register whatever lost its lease."""
        assert self.membership is not None
        changed = False
        for i in self.mine:
            svc = self.up.services[i.name]
            if svc.process is not None and svc.process.poll() is not None:
                log.warning("%s exited with %s; starting it again", i.name, svc.process.returncode)
                lease = self.leases.pop(i.name, None)
                if lease is not None:
                    self._quietly(self.membership.revoke, lease)
                svc.restarts += 1
                self.launch(i)
                changed = True
        for i in self.mine:
            if i.role in NOT_SDCP:
                continue
            lease = self.leases.get(i.name)
            try:
                if lease is not None and self.membership.keep_alive(lease):
                    continue
                if self.up.healthy(self.up.services[i.name]):
                    self.register(i)
            except (OSError, EtcdError) as exc:
                log.warning("membership of %s not renewed: %s", i.name, exc)
        if changed:
            self.write_state()

    @staticmethod
    def _quietly(call: Any, *args: Any) -> None:
        try:
            call(*args)
        except (OSError, EtcdError) as exc:
            log.warning("%s: %s", getattr(call, "__name__", call), exc)

    def run(self) -> None:
        period = self.spec.lease_ttl_s / 3
        while not self.stopping.wait(period):
            self.tend()

    def stop(self) -> None:
        """Revoke the leases, stop the roles and the MLC, then etcd."""
        log.info("stopping %s", self.host.name)
        began = time.monotonic()
        if self.membership is not None:
            for lease in self.leases.values():
                self._quietly(self.membership.revoke, lease)
            self.membership.close()
        etcd = {n: s for n, s in self.up.services.items() if s.role == "etcd"}
        for name in etcd:
            del self.up.services[name]
        self.up.stop()
        log.info("roles and MLC stopped in %.1f s", time.monotonic() - began)
        self.up.services = etcd
        # A member whose peers stop with it spends seconds on leader transfer; its WAL makes a
        # kill after a short grace safe.
        self.up.stop(timeout=3.0)
        log.info("%s stopped in %.1f s", self.host.name, time.monotonic() - began)


def wait_port(host: str, port: int, deadline: float) -> None:
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}:{port} does not take connections") from None
            time.sleep(0.2)


def run_node(spec: ClusterSpec, host: str, directory: Path, timeout: float = 180.0) -> int:
    """Start ``host``'s part, keep it until SIGTERM or SIGINT, stop it."""
    node = Node(spec, host, directory)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.stopping.set())
    try:
        node.start(timeout)
        print(f"sdcp-fast node {host}: {', '.join(i.name for i in node.mine)} running "
              f"({node.state_file})", flush=True)
        node.run()
        return 0
    except (RuntimeError, TimeoutError, ValueError, EtcdError, OSError) as exc:
        print(f"sdcp-fast node {host}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        node.stop()
