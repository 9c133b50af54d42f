"""HTTP header fields as the transports hand them to handlers and send them: lower-case
names, repeated fields joined, and the connection-specific fields left out (RFC 9113 §8.2.2,
RFC 9110 §7.6.1), for HTTP/2 and HTTP/1.1 alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode

# Connection-specific fields are forbidden in HTTP/2 (RFC 9113 §8.2.2); h2 rejects them.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"})


def header_dict(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Regular (non-pseudo) fields as a lower-case dict; repeated fields joined by ``, ``."""
    out: dict[str, str] = {}
    for raw_name, raw_value in headers:
        if raw_name[:1] == b":":
            continue
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def outbound_fields(headers: dict[str, str] | None) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in (headers or {}).items() if k.lower() not in HOP_BY_HOP]


# What a client never sends from a caller's headers: the connection-specific fields, and the
# two it sets itself (content-length from the body, :authority for host).
NOT_SENT = HOP_BY_HOP | {"content-length", "host"}


def response_fields(headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, str]]:
    """A response's ``:status`` (0 if absent) and :func:`header_dict` of its fields, in one pass."""
    status = 0
    out: dict[str, str] = {}
    for raw_name, raw_value in headers:
        if raw_name[:1] == b":":
            if raw_name == b":status":
                status = int(raw_value)
            continue
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        out[name] = f"{out[name]}, {value}" if name in out else value
    return status, out


def query_string(query: Mapping[str, str]) -> str:
    """``urllib.parse.urlencode(query)``, without its cost where nothing needs escaping."""
    parts = []
    for name, value in query.items():
        # Letters and digits are never escaped; anything else takes urlencode's rules.
        if not (name.isalnum() and name.isascii() and value.isalnum() and value.isascii()):
            return urlencode(query)
        parts.append(f"{name}={value}")
    return "&".join(parts)
