"""``sdcp-fast router``: the router role as a service (Table 1: instances/{id}/status, events)
over HTTP/2 with mutual TLS; it opens sessions, assigns drafters and fails verifiers over."""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from sdcp_fast.protocol.peer import PeerRole

if TYPE_CHECKING:
    from sdcp_fast.deploy.catalog import Target
    from sdcp_fast.roles.frontend_server import FrontendServer
    from sdcp_fast.roles.router import RouterRole
    from sdcp_fast.store.interface import Store
    from sdcp_fast.transport.base import Transport

HELP = "serve the SDCP router role (status table, assignment, events, fail-over)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sdcp_fast.deploy.service import add_service_arguments
    from sdcp_fast.roles.frontend_admission import PER_KEY, QUEUE, TOTAL

    p.add_argument("--model", default="auto", help="the target model (its digests go into contracts); default auto")
    p.add_argument("--drafter-model", action="append", default=[], metavar="URI=SPEC",
                   help="a drafter instance and the model it serves, as a drafter spec (ngram, model:NAME, ...) "
                        "or a 64-hex-digit digest; repeat per drafter")
    p.add_argument("--scope", help="the KVSP scope of this router's sessions, 32 hex digits (default random); "
                                   "its routing records are named in it, so a restarted router, or another one "
                                   "sharing the records, needs the same scope to adopt the sessions")
    add_service_arguments(p, name="router", port=8500, router=False)
    p.add_argument("--etcd", metavar="HOST:PORT[,...]",
                   help="a cluster's etcd members (sdcp-fast node gives them, with --cluster): verifiers and "
                        "drafters are discovered from its membership registry instead of --drafter-model, and "
                        "routing records and commit logs are kept in etcd, not in the MLC")
    p.add_argument("--cluster", metavar="TOKEN", help="the cluster's name in etcd (its spec's token); with --etcd")
    api = p.add_argument_group("front end", "the OpenAI-compatible API for clients (docs/frontend.md)")
    api.add_argument("--api-listen", metavar="HOST:PORT", default="127.0.0.1:8000",
                     help="where the front end listens (default 127.0.0.1:8000; port 0: any free one)")
    api.add_argument("--api-h2-listen", metavar="HOST:PORT",
                     help="also serve the front end over HTTP/2 here (h2c with prior knowledge, or TLS with --api-cert)")
    api.add_argument("--api-key", action="append", default=[], metavar="KEY",
                     help="a key clients send as 'Authorization: Bearer KEY' (repeatable; also $SDCP_FAST_API_KEY "
                          "and --api-key-file); none: no key is asked")
    api.add_argument("--api-key-file", metavar="FILE", help="keys, one a line")
    api.add_argument("--api-cert", metavar="PEM", help="serve the front end over TLS with this server certificate")
    api.add_argument("--api-cert-key", metavar="PEM", help="the private key of --api-cert")
    api.add_argument("--api-per-key", type=int, default=PER_KEY, metavar="N",
                     help=f"requests in flight per key at most; more wait their turn (default {PER_KEY})")
    api.add_argument("--api-max-inflight", type=int, default=TOTAL, metavar="N",
                     help=f"requests in flight in all at most; more wait their turn (default {TOTAL})")
    api.add_argument("--api-tokenizer-dir", metavar="DIR",
                     help="write the served model's tokenizer here (tokenizer.json, tokenizer_config.json) for "
                          "load generators that count tokens (AIPerf)")
    api.add_argument("--api-queue", type=int, default=QUEUE, metavar="N",
                     help=f"requests waiting for their turn at most, in all; one more is 429 (default {QUEUE})")
    from sdcp_fast.cli._options import add_weights_argument

    add_weights_argument(p)  # the target digest in contracts follows the form of the weights


def drafter_models(entries: list[str], target: Target) -> dict[str, bytes]:
    from sdcp_fast.deploy.catalog import load_drafter

    models = {}
    for entry in entries:
        uri, sep, spec = entry.rpartition("=")
        if not sep or not uri:
            raise ValueError(f"expected URI=SPEC, got {entry!r}")
        if len(spec) == 64 and all(c in "0123456789abcdef" for c in spec.lower()):
            models[uri] = bytes.fromhex(spec)
        else:
            models[uri] = load_drafter(spec, target)[1]
    return models


def run(args: argparse.Namespace) -> int:
    from sdcp_fast.cli._options import mlc_nodes
    from sdcp_fast.deploy.catalog import load_target
    from sdcp_fast.deploy.service import run_role

    def load() -> _Loaded:
        target = load_target(args.model, weights=args.weights)
        return _Loaded(target, drafter_models(args.drafter_model, target),
                       bytes.fromhex(args.scope) if args.scope else None)

    return run_role(args, PeerRole.ROUTER, load, partial(_role, args),
                    lambda loaded: f"{len(loaded.models)} drafters registered", mlc_nodes)


class _Loaded(NamedTuple):
    target: Target
    models: dict[str, bytes]
    scope: bytes | None


def _role(args: argparse.Namespace, loaded: _Loaded, store: Store, transport: Transport) -> _WithApi:
    from sdcp_fast.roles.frontend import mount_frontend
    from sdcp_fast.roles.frontend_server import FrontendServer, api_keys
    from sdcp_fast.roles.frontend_text import HFTokenizer, ToyWords, save_tokenizer
    from sdcp_fast.roles.router import RouterRole

    target = loaded.target
    role = RouterRole(uri=args.uri, mlc=store, transport=transport, target_digest=target.digest,
                      tokenizer_digest=target.tokenizer_digest, drafter_models=loaded.models, scope=loaded.scope,
                      **_in_cluster(args, target))
    tokenizer = ToyWords() if target.loaded is None else HFTokenizer(target.loaded.tokenizer)
    if args.api_tokenizer_dir:
        save_tokenizer(tokenizer, args.api_tokenizer_dir, context=target.context)
    frontend = mount_frontend(role, tokenizer, stop=target.stop, model=target.name, context=target.context,
                              vocab=target.vocab_size)
    server = FrontendServer(frontend, api_keys(args.api_key, args.api_key_file), per_key=args.api_per_key,
                            total=args.api_max_inflight, queue=args.api_queue)
    return _WithApi(role, server, args)


def _in_cluster(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """RouterRole's cluster parts where --etcd is given (sdcp_fast/cluster/discovery.py,
    etcd_records.py); none otherwise."""
    if not args.etcd:
        return {}
    from sdcp_fast.cluster.discovery import Discovery
    from sdcp_fast.cluster.etcd_client import parse_endpoints
    from sdcp_fast.cluster.etcd_records import EtcdRecords, commit_log_ref
    from sdcp_fast.cluster.membership_etcd import Membership
    from sdcp_fast.deploy.catalog import load_drafter

    if not args.cluster:
        raise ValueError("--etcd needs --cluster (the cluster's token)")
    endpoints = parse_endpoints(args.etcd)
    registry = Membership(args.cluster, endpoints)
    local = endpoints[0][1]  # every host runs a member: its roles reach the logs through it
    records = EtcdRecords(args.cluster, endpoints)
    return {"discovery": Discovery(registry.members, lambda kind: load_drafter(kind, target)[1]),
            "records": records, "durable": records.refusal,
            "commit_logs": lambda scope, session: commit_log_ref(args.cluster, local, scope, session)}


class _WithApi:
    """The router role served on its SDCP port, and its front end on the client-facing one."""

    def __init__(self, role: RouterRole, server: FrontendServer, args: argparse.Namespace) -> None:
        self.role, self.server, self.args = role, server, args

    @property
    def handler(self) -> Any:
        return self.role.handler

    async def start(self) -> None:
        import sys

        await self.role.start()
        host, _, port = self.args.api_listen.rpartition(":")
        url = await self.server.start(host or "127.0.0.1", int(port), certfile=self.args.api_cert,
                                      keyfile=self.args.api_cert_key)
        keys = len(self.server.keys)
        print(f"sdcp-fast router: front end at {url} (HTTP/1.1, "
              f"{f'{keys} API key(s)' if keys else 'no API key asked'})", file=sys.stderr, flush=True)
        if self.args.api_h2_listen:
            host, _, port = self.args.api_h2_listen.rpartition(":")
            url = await self.server.start_h2(host or "127.0.0.1", int(port), certfile=self.args.api_cert,
                                             keyfile=self.args.api_cert_key)
            print(f"sdcp-fast router: front end at {url} (HTTP/2)", file=sys.stderr, flush=True)

    async def close(self) -> None:
        await self.server.close()
        await self.role.close()
