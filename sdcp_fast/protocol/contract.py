"""The session contract (draft §4.1): its digest and the questions the core asks of it.

The contract's members, types and limits are declared with the :class:`Contract` message;
anything a contract breaks, an unknown key included, is :class:`BadContract`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from sdcp_fast.protocol import cbor
from sdcp_fast.protocol.messages import Action, Contract

CONTRACT_DOMAIN = b"SDCP-CONTRACT-1\x00"


def parse_contract(contract: Contract | Mapping[str, Any]) -> Contract:
    """``contract`` typed and validated (a decoded CBOR map, or an already typed Contract)."""
    if isinstance(contract, Contract):
        contract.to_map()  # validates; a typed contract can be built with any values
        return contract
    return Contract.from_map(contract)


def contract_digest(contract: Contract | Mapping[str, Any]) -> bytes:
    """SHA-256("SDCP-CONTRACT-1" || 0x00 || deterministic_cbor(contract)).

    Accepts the typed :class:`Contract` or the decoded map with text keys. The map is
    validated first and the digest is taken over exactly its members, so optional members
    that were absent stay absent.
    """
    typed = parse_contract(contract)
    return hashlib.sha256(CONTRACT_DOMAIN + cbor.deterministic_cbor(typed.to_map())).digest()


def fallback_actions(contract: Contract) -> tuple[Action, ...]:
    """The fallback ladder as actions; values the registry does not know read as FAIL (§5.2)."""
    return tuple(Action.parse(value) for value in contract.fallback)


def permits_drafter(contract: Contract, model: bytes) -> bool:
    """Whether a draft model (SHA-256 of its weights) may serve the session (§4.1, §6.1)."""
    return contract.drafters is None or model in contract.drafters
