"""Names of MLC objects.

``mlc://<scope-hex>/<session>/<kind>/<round>``: the 16-byte KVSP scope of the session
contract (32 lowercase hex digits) is the namespace, so one scope's accounting and
clean-up never touch another's. ``<session>`` is the base64url session id of §5.1;
``<round>`` is omitted for per-session objects (``prompt_kv``, ``commit_log``). A round may
carry its writer's tag, ``<round>.<tag>`` (:func:`writer_tag`): a name with a tag is one only
that writer can create (the MLC refuses anyone else, cache/policy.py), so nobody can take the
name a drafter's rows will have, and a drafter that takes over a session names its rows apart
from those its predecessor left under the same round (docs/security.md, "Names nobody can
squat"). An untagged name is owned by its first writer.

In a cluster of several MLC nodes (one per host) a name may name its node:
``mlc://<host>:<port>/<scope-hex>/...``, the authority of the node's base URI
``https://<host>:<port>`` (the port is always given, so a node never reads as a scope). The
node keeps the object under the plain name (:func:`local_name`), so writer tags, policy and
scope accounting see the same name on every node; a plain name is the reader's own node's
(docs/interpretations.md, "MLC nodes in object names").
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from sdcp_fast.protocol.messages import session_path_id

SCHEME = "mlc://"
KINDS = frozenset({"q_rows", "draft_kv", "prompt_kv", "target_kv", "committed_tokens", "prompt", "commit_log",
                   "routing"})
NO_SCOPE = "-"

_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TAG = re.compile(r"^[A-Za-z0-9_\-]{1,32}$")
_SCOPE = re.compile(r"^[0-9a-f]{32}$")
_DNS = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?)*$")


@dataclass(frozen=True)
class ObjectName:
    scope: bytes
    session: str
    kind: str
    round: int | None = None
    tag: str | None = None  # the writer's, after the round

    def __str__(self) -> str:
        tail = "" if self.round is None else f"/{self.round}"
        if self.tag is not None:
            tail += f".{self.tag}"
        return f"{SCHEME}{self.scope.hex()}/{self.session}/{self.kind}{tail}"


def writer_tag(base_uri: str) -> str:
    """The tag of the instance at ``base_uri`` (its certificate's URI SAN; a trailing slash is
    not significant): 24 hex digits (96 bits) of the URI's SHA-256."""
    return hashlib.sha256(base_uri.rstrip("/").encode()).hexdigest()[:24]


def tagged_for_another(uri: str, writer: str) -> bool:
    """Whether ``uri`` carries the tag of a writer other than ``writer``: an object a reader
    must not take as ``writer``'s, whoever made it."""
    try:
        tag = parse(uri).tag
    except ValueError:
        return False
    return tag is not None and tag != writer_tag(writer)


def object_uri(scope: bytes, session: bytes | str, kind: str, round: int | None = None, *,
               tag: str | None = None) -> str:
    """The URI of one draft artifact; ``session`` may be the 16 raw bytes or its base64url form."""
    if len(scope) != 16:
        raise ValueError("scope is the contract's 16-byte KVSP Scope ID")
    if kind not in KINDS:
        raise ValueError(f"unknown object kind {kind!r}")
    if round is not None and round < 0:
        raise ValueError("round is a uint")
    if tag is not None and (round is None or not _TAG.match(tag)):
        raise ValueError("a tag follows a round: 1-32 of [A-Za-z0-9_-]")
    if isinstance(session, bytes):
        if len(session) != 16:
            raise ValueError("session is the 16-byte session id")
        session = session_path_id(session)
    return str(ObjectName(scope, session, kind, round, tag))


def node_authority(text: str) -> str:
    """The canonical ``host:port`` of a node, from its authority or its base URI
    (``https://host:port``, a trailing slash not significant): the host lowercased, an IPv6
    address bracketed and compressed, the port explicit. ValueError for anything else (a
    path, user info, another scheme, no port)."""
    base = text if "://" in text else "https://" + text
    parts = urlsplit(base.rstrip("/"))
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname
    if (parts.scheme != "https" or parts.path or parts.query or parts.fragment or "@" in parts.netloc
            or port is None or not 0 < port < 65536 or not host):
        raise ValueError(f"an MLC node is https://<host>:<port>: {text!r}")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        # An all-digit last label is a malformed address, never a name (RFC 1123 §2.1).
        if not _DNS.match(host) or _SCOPE.match(host) or host.rpartition(".")[2].isdigit():
            raise ValueError(f"not a host name: {host!r}") from None
        return f"{host}:{port}"
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def node_base(node: str) -> str:
    """The base URI of the node ``node`` (``host:port``): where its HTTP API is served."""
    return "https://" + node_authority(node)


def _split_node(uri: str) -> tuple[str | None, str]:
    """``(node, plain name)`` of an ``mlc://`` URI; the node None for a plain name."""
    if not uri.startswith(SCHEME):
        raise ValueError(f"not an mlc:// URI: {uri!r}")
    head, slash, rest = uri[len(SCHEME):].partition("/")
    if ":" not in head:
        return None, uri
    if not slash:
        raise ValueError(f"a node's name has a path: {uri!r}")
    node = node_authority(head)
    if node != head:
        raise ValueError(f"a node is named in its canonical form {node!r}: {uri!r}")
    return node, SCHEME + rest


def node_of(uri: str) -> str | None:
    """The node (``host:port``) an ``mlc://`` URI names, None for a plain name."""
    return _split_node(uri)[0]


def local_name(uri: str) -> str:
    """The name the object has at its node: ``uri`` without its node."""
    return _split_node(uri)[1]


def at_node(uri: str, node: str) -> str:
    """``uri`` named at ``node`` (an authority or a base URI); a name that already names a
    node is left as it is."""
    where, plain = _split_node(uri)
    if where is not None:
        return uri
    return f"{SCHEME}{node_authority(node)}/{plain[len(SCHEME):]}"


def parse(uri: str) -> ObjectName:
    """Split an ``mlc://`` URI (plain, or naming its node, which is not part of the object's
    name); ValueError when it is not one."""
    uri = local_name(uri)
    parts = uri[len(SCHEME):].split("/")
    if len(parts) not in (3, 4) or not _SCOPE.match(parts[0]):
        raise ValueError(f"expected mlc://<scope-hex32>/<session>/<kind>[/<round>]: {uri!r}")
    if not all(_SEGMENT.match(p) for p in parts[1:]):
        raise ValueError(f"bad path segment in {uri!r}")
    round_, tag = None, None
    if len(parts) == 4:
        digits, dot, tag_ = parts[3].partition(".")
        if not digits.isdigit():
            raise ValueError(f"round must be decimal: {uri!r}")
        if dot and not _TAG.match(tag_):
            raise ValueError(f"a round's tag is 1-32 of [A-Za-z0-9_-]: {uri!r}")
        round_, tag = int(digits), (tag_ if dot else None)
    return ObjectName(bytes.fromhex(parts[0]), parts[1], parts[2], round_, tag)


_SESSION = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")  # base64url, no padding, no dots


def served_name(uri: str, *, log: bool = False) -> ObjectName:
    """The documented form the HTTP API accepts: ``mlc://<scope>/<session>/<kind>[/<round>]``
    with a known kind and a base64url session; a log is ``.../commit_log`` (no round) and an
    object never is. ValueError otherwise."""
    if node_of(uri) is not None:
        raise ValueError(f"a node keeps its objects under their plain names (mlc://<scope>/...): {uri!r}")
    name = parse(uri)
    if name.kind not in KINDS or not _SESSION.match(name.session):
        raise ValueError(f"expected mlc://<scope-hex32>/<base64url session>/<kind>[/<round>]: {uri!r}")
    if log != (name.kind == "commit_log") or (log and name.round is not None):
        raise ValueError(f"{uri!r} is not " + ("a commit log" if log else "an object") + " name")
    return name


@functools.lru_cache(maxsize=4096)
def scope_of(uri: str) -> str:
    """Accounting key: the scope hex of an ``mlc://`` URI (with or without its node), ``-``
    for any other name."""
    if uri.startswith(SCHEME):
        parts = uri[len(SCHEME):].split("/", 2)
        head = parts[1] if ":" in parts[0] and len(parts) > 1 else parts[0]
        if _SCOPE.match(head):
            return head
    return NO_SCOPE


def check_key(uri: str) -> str:
    """Any printable name without spaces is accepted as a key (other schemes are opaque to us)."""
    if not uri or len(uri) > 1024 or not uri.isprintable() or " " in uri:
        raise ValueError(f"bad object name {uri!r}")
    return uri
