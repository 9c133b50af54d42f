"""The SDCP protocol core: pure, synchronous, no I/O, no clock, no torch.

Servers and engines are thin adapters: decode bytes, call the core, encode.
"""

from sdcp_fast.protocol.messages import (
    Action,
    Assignment,
    Contract,
    Event,
    Output,
    Policy,
    Proposal,
    Resume,
    Sampling,
    SessionOpen,
    SessionState,
    Status,
    Verdict,
)
from sdcp_fast.protocol.problems import (
    BadContract,
    BadProposal,
    BadRequest,
    Limit,
    NotAssigned,
    QUnavailable,
    SdcpProblem,
    SessionClosed,
    StaleBase,
    StaleEpoch,
    UnknownSession,
)

__all__ = [
    "Action", "Assignment", "Contract", "Event", "Output", "Policy", "Proposal", "Resume", "Sampling",
    "SessionOpen", "SessionState", "Status", "Verdict",
    "BadContract", "BadProposal", "BadRequest", "Limit", "NotAssigned", "QUnavailable", "SdcpProblem",
    "SessionClosed", "StaleBase", "StaleEpoch", "UnknownSession",
]
