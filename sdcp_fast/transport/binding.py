"""Where a transport may run without TLS: loopback only, and never silently (--insecure)."""

from __future__ import annotations

import ipaddress
import logging

log = logging.getLogger("sdcp_fast.transport")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_insecure(host: str, what: str) -> None:
    """Refuse ``host`` unless it is loopback, and warn loudly that nothing is authenticated."""
    if not is_loopback(host):
        raise ValueError(f"--insecure {what} refused for {host!r}: plain HTTP/2 without TLS is allowed "
                         "on loopback addresses only (127.0.0.0/8, ::1, localhost)")
    log.warning("INSECURE: %s %s without TLS: no encryption, no peer authentication; "
                "every request is served as from an unauthenticated peer. Use for local debugging only.",
                what, host)
