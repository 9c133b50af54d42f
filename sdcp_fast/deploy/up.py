"""The embedded default deployment on one machine: an MLC, a router, an active and a standby
verifier and two drafters of different kinds, each its own process, on loopback, with
development certificates (mutual TLS), supervised until interrupted. ``routers`` > 1 starts
that many routers over the same routing records (one scope, kept in ``DIR/scope``; each its
own SDCP port and client-facing port); every verifier and drafter reports to each, and a
client resumes its stream at any of them (docs/frontend.md, "Resuming a stream").

``Up.start()`` writes the certificates, starts every process and waits until each answers;
``Up.endpoints()`` is what ``DIR/endpoints.json`` holds; ``Up.supervise()`` restarts any
process that dies (a verifier killed with -9 comes back empty, as the new standby, once the
router has moved its sessions to the other one); ``Up.stop()`` ends them all.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("sdcp_fast.up")

TOY_DRAFTERS = ("toy-good", "toy-weak")
REAL_DRAFTERS = ("ngram", "model:smollm2-draft")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Service:
    name: str
    role: str  # mlc, router, verifier, drafter
    port: int
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    log_path: Path | None = None

    @property
    def uri(self) -> str:
        return f"https://127.0.0.1:{self.port}/" if self.role != "mlc" else f"https://127.0.0.1:{self.port}"


@dataclass
class Up:
    directory: Path
    model: str = "auto"
    drafters: tuple[str, ...] | None = None
    base_port: int | None = None
    status_ttl_ms: int = 3000
    threads: int = 1
    # Passed to the services as they are; None leaves each service its own default (drafters:
    # §6.2's adaptive M; verifiers: their batch limit; both: the CPU).
    fixed_m: int | None = None
    max_batch: int | None = None
    prefill_chunk: int | None = None
    prefill_solo: int | None = None
    device: str | None = None
    weights: str | None = None  # --weights of the router, verifiers and drafters (one form: one digest)
    routers: int = 1
    # The front end's admission (router --api-per-key, --api-max-inflight, --api-queue); None: the router's.
    max_inflight_per_key: int | None = None
    max_inflight: int | None = None
    max_queue: int | None = None
    services: dict[str, Service] = field(default_factory=dict)
    api_port: int = 0
    api_ports: list[int] = field(default_factory=list)  # one per router, the first is api_port

    def api_key_file(self) -> Path:
        return self.directory / "certs" / "api-key"

    def api_key(self) -> str:
        """The front end's API key, made once per directory (kept across restarts)."""
        path = self.api_key_file()
        if not path.exists():
            import secrets

            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text("sk-sdcp-" + secrets.token_hex(16) + "\n")
        return path.read_text().strip()

    def routers_scope(self) -> str:
        """The routers' scope, made once per directory: their routing records are named in it."""
        path = self.directory / "scope"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(os.urandom(16).hex() + "\n")
        return path.read_text().strip()

    def tokenizer_dir(self) -> Path:
        """The served model's tokenizer, for load generators (the first router writes it)."""
        return self.directory / "tokenizer"

    def router_names(self) -> list[str]:
        return ["router"] + [f"router-{i}" for i in range(2, self.routers + 1)]

    def _ports(self, n: int) -> list[int]:
        if self.base_port is None:
            return [free_port() for _ in range(n)]
        return [self.base_port + i for i in range(n)]

    def plan(self) -> None:
        from sdcp_fast.deploy.catalog import resolve

        model = resolve(self.model)
        self.model = model
        drafters = self.drafters or (TOY_DRAFTERS if model == "toy" else REAL_DRAFTERS)
        routers = self.router_names()
        names = ["mlc", "router", "verifier", "verifier-standby"] + [f"drafter-{c}" for c in "ab"[: len(drafters)]]
        names.append("api")  # the front end's client-facing port (the router serves it)
        names += [n for r in routers[1:] for n in (r, f"api-{r}")]  # after the default's ports: those stay
        ports = dict(zip(names, self._ports(len(names)), strict=True))
        certs = str(self.directory / "certs")
        py = [sys.executable, "-m", "sdcp_fast"]
        mlc_url = f"https://127.0.0.1:{ports['mlc']}"
        router = ",".join(f"https://127.0.0.1:{ports[r]}/" for r in routers)  # verifiers and drafters: each
        common = ["--certs", certs, "--mlc", mlc_url, "--status-ttl-ms", str(self.status_ttl_ms)]
        s = self.services
        self.api_port = ports["api"]
        self.api_ports = [ports["api"], *(ports[f"api-{r}"] for r in routers[1:])]
        s["mlc"] = Service("mlc", "mlc", ports["mlc"], [
            *py, "mlc", "--port", str(ports["mlc"]), "--root", str(self.directory / "mlc"),
            "--certs", certs, "--name", "mlc"])
        drafter_uris = {f"drafter-{c}": f"https://127.0.0.1:{ports[f'drafter-{c}']}/" for c in "ab"[: len(drafters)]}
        for name, api in zip(routers, self.api_ports, strict=True):
            s[name] = Service(name, "router", ports[name], [
                *py, "router", "--uri", f"https://127.0.0.1:{ports[name]}/", "--name", name, "--model", model,
                *common, "--api-listen", f"127.0.0.1:{api}", "--api-key-file", str(self.api_key_file()),
                "--scope", self.routers_scope(), *self._option("--weights", self.weights),
                *self._option("--api-per-key", self.max_inflight_per_key),
                *self._option("--api-max-inflight", self.max_inflight),
                *self._option("--api-queue", self.max_queue),
                *(("--api-tokenizer-dir", str(self.tokenizer_dir())) if name == "router" else ()),
                *(a for d, spec in zip(drafter_uris, drafters, strict=True)
                  for a in ("--drafter-model", f"{drafter_uris[d]}={spec}"))])
        for name in ("verifier", "verifier-standby"):
            s[name] = Service(name, "verifier", ports[name], [
                *py, "verifier", "--uri", f"https://127.0.0.1:{ports[name]}/", "--name", name, "--router", router,
                "--model", model, *common, *self._option("--max-batch", self.max_batch),
                *self._option("--prefill-chunk", self.prefill_chunk),
                *self._option("--prefill-solo", self.prefill_solo),
                *self._option("--device", self.device), *self._option("--weights", self.weights)])
        for name, spec in zip(drafter_uris, drafters, strict=True):
            s[name] = Service(name, "drafter", ports[name], [
                *py, "drafter", "--uri", drafter_uris[name], "--name", name, "--router", router, "--model", model,
                "--drafter", spec, "--threads", str(self.threads), *common, *self._option("--m", self.fixed_m),
                *self._option("--device", self.device), *self._option("--weights", self.weights)])

    @staticmethod
    def _option(flag: str, value: object) -> list[str]:
        return [] if value is None else [flag, str(value)]

    def write_certificates(self) -> None:
        from sdcp_fast.protocol.peer import PeerRole
        from sdcp_fast.transport.certs import InstanceSpec, write_certificates

        specs = [InstanceSpec(svc.name, PeerRole(svc.role), svc.uri if svc.role != "mlc" else svc.uri + "/")
                 for svc in self.services.values()]
        specs.append(InstanceSpec("client", PeerRole.CLIENT, None))
        write_certificates(self.directory / "certs", specs)

    def launch(self, svc: Service) -> None:
        logs = self.directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        svc.log_path = logs / f"{svc.name}.log"
        out = open(svc.log_path, "ab")  # noqa: SIM115 - the child owns it
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        svc.process = subprocess.Popen(svc.argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        out.close()

    def start(self, timeout: float = 180.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.plan()
        self.write_certificates()
        self.api_key()
        self.launch(self.services["mlc"])
        self.wait_healthy(["mlc"], timeout)
        for svc in self.services.values():
            if svc.name != "mlc":
                self.launch(svc)
        self.wait_healthy([n for n in self.services if n != "mlc"], timeout)
        for name in self.router_names():
            self.wait_registered(timeout, name)
        for port in self.api_ports:
            self.wait_api(timeout, port)
        (self.directory / "endpoints.json").write_text(json.dumps(self.endpoints(), indent=1) + "\n")

    def wait_healthy(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            for name in list(pending):
                svc = self.services[name]
                assert svc.process is not None
                if svc.process.poll() is not None:
                    tail = svc.log_path.read_text()[-2000:] if svc.log_path else ""
                    raise RuntimeError(f"{name} exited with {svc.process.returncode} while starting:\n{tail}")
                if self.healthy(svc):
                    pending.remove(name)
            if pending and time.monotonic() > deadline:
                where = "; ".join(f"{name}: {self.last_line(name)}" for name in pending)
                raise TimeoutError(f"not healthy after {timeout:.0f}s: {', '.join(pending)} "
                                   f"(logs in {self.directory / 'logs'}; last lines: {where}); "
                                   "a slow machine needs a longer --timeout")
            if pending:
                time.sleep(0.2)

    def last_line(self, name: str) -> str:
        """The last line ``name`` logged (where its start is), or that it logged none."""
        path = self.services[name].log_path
        lines = path.read_text(errors="replace").splitlines() if path is not None and path.exists() else []
        return repr(lines[-1][-200:]) if lines else "nothing logged yet"

    def wait_registered(self, timeout: float, router: str = "router") -> None:
        """Until ``router`` has a live status from every verifier and drafter (GET instances)."""
        import asyncio

        from sdcp_fast.transport.h2client import H2Transport
        from sdcp_fast.transport.tls import client_context

        e = self.endpoints()
        wanted = {svc.uri for svc in self.services.values() if svc.role in ("verifier", "drafter")}

        async def poll() -> None:
            client = H2Transport(client_context(e["client_cert"], e["client_key"], e["ca"]))
            deadline = time.monotonic() + timeout
            try:
                while True:
                    response = await client.request(self.services[router].uri, "GET", "instances", timeout=5)
                    if response.status == 200 and wanted <= {i["instance"] for i in json.loads(response.body)}:
                        return
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the router did not hear from every instance within {timeout:.0f}s")
                    await asyncio.sleep(0.1)
            finally:
                await client.close()

        asyncio.run(poll())

    def wait_api(self, timeout: float, port: int | None = None) -> None:
        """Until the front end's port (the first router's unless ``port``) takes connections."""
        port = self.api_port if port is None else port
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the front end did not listen on port {port} within {timeout:.0f}s") \
                        from None
                time.sleep(0.1)

    def healthy(self, svc: Service) -> bool:
        """Completes TLS with our CA and the client certificate, choosing HTTP/2 (ALPN h2)."""
        from sdcp_fast.transport.tls import client_context

        certs = self.directory / "certs"
        # ALPN h2 only: every service, the MLC too, serves HTTP/2.
        ctx = client_context(str(certs / "client.pem"), str(certs / "client.key"), str(certs / "ca.pem"))
        try:
            with socket.create_connection(("127.0.0.1", svc.port), timeout=1) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.selected_alpn_protocol() == "h2"
        except OSError:
            return False

    def endpoints(self) -> dict[str, Any]:
        certs = self.directory / "certs"
        return {
            "model": self.model,
            "services": {name: {"role": svc.role, "url": svc.uri,
                                "pid": svc.process.pid if svc.process else None}
                         for name, svc in self.services.items()},
            "ca": str(certs / "ca.pem"), "client_cert": str(certs / "client.pem"),
            "client_key": str(certs / "client.key"),
            "frontend": f"http://127.0.0.1:{self.api_port}/v1/",  # the OpenAI-compatible API, for clients
            # Every router's front end (the first is "frontend"): a stream resumes at any of them.
            "frontends": [f"http://127.0.0.1:{port}/v1/" for port in self.api_ports],
            "api_key": self.api_key(),
            # The same API on the router's SDCP port, for tools holding the client certificate.
            "frontend_mtls": self.services["router"].uri + "v1/",
            # The served model's tokenizer (Hugging Face form), for load generators.
            "tokenizer": str(self.tokenizer_dir()),
            "logs": str(self.directory / "logs"),
        }

    def supervise_once(self) -> list[str]:
        """Restart every process that died; their names."""
        restarted = []
        for svc in self.services.values():
            if svc.process is not None and svc.process.poll() is not None:
                log.warning("%s exited with %s; restarting it", svc.name, svc.process.returncode)
                svc.restarts += 1
                self.launch(svc)
                restarted.append(svc.name)
        if restarted:
            (self.directory / "endpoints.json").write_text(json.dumps(self.endpoints(), indent=1) + "\n")
        return restarted

    def stop(self, timeout: float = 10.0) -> None:
        procs = [svc.process for svc in self.services.values() if svc.process is not None]
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
