"""What the kit sends and reads: answers, its two identities, and the session-state that a
409 problem carries under whatever member name the implementation chose."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sdcp_fast.protocol.peer import Peer
from sdcp_fast.protocol.problems import type_suffix

# (method, path, body, query) -> Answer, sent with one identity to the instance under test.
Send = Callable[..., Awaitable["Answer"]]
SESSION_STATE_KEYS = ("session", "epoch", "round", "committed", "digest")


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str

    @property
    def suffix(self) -> str | None:
        """The problem type's Table 2 suffix (its last segment), for a Problem Details answer."""
        if not self.content_type.startswith("application/problem+json"):
            return None
        try:
            return type_suffix(json.loads(self.body)["type"])
        except (ValueError, KeyError, TypeError):
            return None

    def problem(self) -> dict[str, Any]:
        try:
            body = json.loads(self.body)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def brief(self) -> str:
        if 200 <= self.status < 300:
            return f"answered {self.status}"
        return f"answered {self.status} " + (self.suffix or repr(self.body[:80]))


@dataclass
class Identities:
    """The kit's two client identities: base URI and role from each certificate's URI SANs."""

    router: Peer
    drafter: Peer


def certificate_peer(path: str) -> Peer:
    """The identity (base URI, role) a certificate gives, read from its URI SANs."""
    from cryptography import x509

    from sdcp_fast.protocol.peer import peer_from_uris

    with open(path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return Peer(None, None)
    return peer_from_uris(sans.get_values_for_type(x509.UniformResourceIdentifier))


def prompt_tokens(prompt: tuple[int, ...] | str) -> tuple[int, ...]:
    """A session-open's prompt as tokens (the kit never sends a cache-ref prompt)."""
    assert not isinstance(prompt, str), "the kit's prompts are tokens"
    return prompt


def brief_output(out: Any) -> str:
    """An output message in short (None: the GET was refused)."""
    if out is None:
        return "no output"
    finish = f", finish {int(out.finish)}" if out.finish is not None else ""
    return f"output from {out.from_}: {list(out.tokens)} at epoch {out.epoch}, final {out.final}{finish}"


def _bytes(value: Any) -> bytes | None:
    """A byte string as JSON can carry one: hex, or base64 / base64url with or without padding."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, list) and all(isinstance(x, int) and 0 <= x < 256 for x in value):
        return bytes(value)
    if not isinstance(value, str):
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        pass
    try:
        return base64.urlsafe_b64decode(value.replace("+", "-").replace("/", "_") + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None


def find_session_state(problem: Any) -> dict[str, Any] | None:
    """The session-state a problem carries: the first map, at any depth and under any member
    name (the draft names none), holding session, epoch, round, committed and digest; byte
    strings decoded from hex or base64. None if there is none."""
    if isinstance(problem, dict):
        if all(k in problem for k in SESSION_STATE_KEYS):
            state = dict(problem)
            state["session"], state["digest"] = _bytes(problem["session"]), _bytes(problem["digest"])
            return state
        for value in problem.values():
            found = find_session_state(value)
            if found is not None:
                return found
    return None


def state_mismatch(found: dict[str, Any] | None, expected: Any) -> str:
    """'' if ``found`` is exactly ``expected`` (a SessionState or Verdict), else what differs."""
    if found is None:
        return "no session-state in the problem"
    wrong = [k for k in SESSION_STATE_KEYS if found.get(k) != getattr(expected, k)]
    return "" if not wrong else "session-state differs in " + ", ".join(
        f"{k} ({found.get(k)!r:.20} for {getattr(expected, k)!r:.20})" for k in wrong)


__all__ = ["Answer", "Identities", "Send", "brief_output", "certificate_peer", "prompt_tokens", "find_session_state", "state_mismatch"]
