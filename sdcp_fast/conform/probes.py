"""§5.1 checks that need connections of the kit's own: "HTTP/2 [RFC9113] or HTTP/3 [RFC9114]
over TLS 1.3 [RFC8446] with mutual certificate authentication is REQUIRED".

- ``tls13-only``: a client that offers only TLS 1.2 (with a valid certificate and ALPN h2) must
  not complete a handshake;
- ``h2-only``: a client that offers both h2 and http/1.1 must be given h2, and one that offers
  only http/1.1 must not be served HTTP/1.1 (a handshake without ALPN is allowed, an HTTP/1.1
  answer is not).
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

Result = dict[str, tuple[bool, str]]


def _context(cert: str, key: str, ca: str, *, tls: ssl.TLSVersion, alpn: list[str]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    ctx.load_cert_chain(cert, key)
    ctx.minimum_version = ctx.maximum_version = tls
    ctx.set_alpn_protocols(alpn)
    return ctx


async def _connect(url: str, ctx: ssl.SSLContext, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    return await asyncio.wait_for(
        asyncio.open_connection(parts.hostname, parts.port or 443, ssl=ctx, server_hostname=parts.hostname),
        timeout)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 2)
    except (OSError, ssl.SSLError, TimeoutError):
        pass


async def probe(url: str, cert: str, key: str, ca: str, *, timeout: float = 10.0) -> Result:
    out: Result = {}
    try:
        _, writer = await _connect(url, _context(cert, key, ca, tls=ssl.TLSVersion.TLSv1_2, alpn=["h2"]), timeout)
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        out["tls13-only"] = (True, f"a TLS 1.2 handshake was refused ({type(exc).__name__})")
    else:
        out["tls13-only"] = (False, "a TLS 1.2 handshake was accepted")
        await _close(writer)
    tls13 = ssl.TLSVersion.TLSv1_3
    try:
        _, writer = await _connect(url, _context(cert, key, ca, tls=tls13, alpn=["h2", "http/1.1"]), timeout)
        chosen = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        await _close(writer)
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        out["h2-only"] = (False, f"a TLS 1.3 client offering h2 was refused ({type(exc).__name__})")
        return out
    if chosen != "h2":
        out["h2-only"] = (False, f"offered h2 and http/1.1, the server chose {chosen!r}")
        return out
    try:
        reader, writer = await _connect(url, _context(cert, key, ca, tls=tls13, alpn=["http/1.1"]), timeout)
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        out["h2-only"] = (True, f"h2 chosen; offering only http/1.1 was refused ({type(exc).__name__})")
        return out
    host = urlsplit(url).netloc
    try:
        writer.write(f"GET {urlsplit(url).path or '/'}health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        head = await asyncio.wait_for(reader.read(16), timeout)
    except (OSError, ssl.SSLError, TimeoutError):
        head = b""
    finally:
        await _close(writer)
    served = head.startswith(b"HTTP/1.")
    out["h2-only"] = (not served, "h2 chosen; offering only http/1.1, " + (
        f"an HTTP/1.1 answer ({head!r})" if served else "no HTTP/1.1 answer"))
    return out
