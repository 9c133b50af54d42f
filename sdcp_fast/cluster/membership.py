"""Membership records, as etcd keys and values (pure: no I/O).

An instance is registered as ``/sdcp/<cluster>/instances/<role>/<name>`` whose value is the
JSON object ``{"role", "name", "host", "uri", "cert_sha256", "model"}``, put under the
lease its holder keeps alive, so the key is gone once its holder stops renewing (a dead
host). ``model`` is a drafter's kind as a drafter spec (``ngram``, ``model:NAME``; empty for
other roles): a router that discovers the drafter turns it into the model digest contracts
permit (a record without it reads as empty).
``cert_sha256`` is the SHA-256 of the instance certificate's DER form: a peer that meets
the instance over TLS can check it is the one registered.
"""

from __future__ import annotations

import hashlib
import json
import ssl
from dataclasses import asdict, dataclass

ROOT = "/sdcp/"


@dataclass(frozen=True)
class Member:
    role: str
    name: str
    host: str
    uri: str
    cert_sha256: str
    model: str = ""


def _segment(text: str) -> str:
    if not text or "/" in text:
        raise ValueError(f"not a key segment: {text!r}")
    return text


def prefix(cluster: str, role: str | None = None) -> str:
    """The keys of ``cluster``'s instances (``role``'s only if given) start with this."""
    base = f"{ROOT}{_segment(cluster)}/instances/"
    return base if role is None else f"{base}{_segment(role)}/"


def key(cluster: str, member: Member) -> str:
    return f"{prefix(cluster, member.role)}{_segment(member.name)}"


def range_end(start: str) -> str:
    """etcd's ``range_end`` for every key that starts with ``start`` (its last byte plus one)."""
    raw = start.encode()
    return (raw[:-1] + bytes([raw[-1] + 1])).decode()


def encode(member: Member) -> bytes:
    return json.dumps(asdict(member), sort_keys=True, separators=(",", ":")).encode()


def decode(value: bytes) -> Member:
    """A record's value; ValueError where it is not one."""
    try:
        data = json.loads(value)
        return Member(**{k: str(data[k]) for k in ("role", "name", "host", "uri", "cert_sha256")},
                      model=str(data.get("model", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a membership record: {value[:80]!r} ({exc})") from None


def cert_digest(pem: bytes) -> str:
    """SHA-256 (hex) of a PEM certificate's DER form."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.decode())).hexdigest()
