"""MLC failures as problem details (RFC 9457), so the HTTP API and in-process callers see
the same identity. Not in the draft's Table 2: these are the cache's own types."""

from __future__ import annotations

from sdcp_fast.protocol.problems import SdcpProblem


class ObjectUnavailable(SdcpProblem, KeyError):
    """Missing, deleted, evicted or lease-expired: the verifier answers sdcp-q-unavailable."""

    suffix = "mlc-unavailable"
    status = 404
    title = "Object is not in the cache"

    def __str__(self) -> str:
        return self.detail


class ObjectLeased(SdcpProblem):
    suffix = "mlc-leased"
    status = 409
    title = "Object is held by a lease"


class UnknownLease(SdcpProblem):
    suffix = "mlc-unknown-lease"
    status = 404
    title = "Lease is unknown or expired"


class CacheFull(SdcpProblem):
    suffix = "mlc-full"
    status = 507
    title = "No tier has room for the object"


class BadRange(SdcpProblem):
    suffix = "mlc-bad-range"
    status = 416
    title = "Byte range outside the object"
