"""The SDCP protocol core: pure, synchronous, no I/O, no clock, no torch.

Servers and engines are thin adapters: decode bytes, call the core, encode.
"""

from sdcp_fast.protocol.cbor import deterministic_cbor
from sdcp_fast.protocol.contract import contract_digest
from sdcp_fast.protocol.digests import extend_digest, prefix_digest
from sdcp_fast.protocol.messages import (
    MEDIA_TYPE,
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
    parse_session_path_id,
    session_path_id,
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
from sdcp_fast.protocol.randoms import VerifierRandom, verifier_uniform

__all__ = [
    "deterministic_cbor", "contract_digest", "prefix_digest", "extend_digest", "verifier_uniform",
    "VerifierRandom", "MEDIA_TYPE", "session_path_id", "parse_session_path_id",
    "Action", "Assignment", "Contract", "Event", "Output", "Policy", "Proposal", "Resume", "Sampling",
    "SessionOpen", "SessionState", "Status", "Verdict",
    "BadContract", "BadProposal", "BadRequest", "Limit", "NotAssigned", "QUnavailable", "SdcpProblem",
    "SessionClosed", "StaleBase", "StaleEpoch", "UnknownSession",
]

# The roles' state machines and rules (verifier session, control, acceptance, drafter, router).
from sdcp_fast.protocol.acceptance import RoundResult, greedy, profile_distribution, speculative  # noqa: E402
from sdcp_fast.protocol.control import SpeculationControl  # noqa: E402
from sdcp_fast.protocol.drafter import AcceptanceEstimator, DrafterSession, choose_m  # noqa: E402
from sdcp_fast.protocol.router import RoutedSession, StatusTable, choose_drafter  # noqa: E402
from sdcp_fast.protocol.session import (  # noqa: E402
    AppendNeeded,
    Discarded,
    InvalidTransition,
    Pending,
    RoundDone,
    ScoreNeeded,
    State,
    Uniforms,
    VerifierSession,
)

__all__ += [
    "RoundResult", "greedy", "profile_distribution", "speculative", "SpeculationControl",
    "AcceptanceEstimator", "DrafterSession", "choose_m", "RoutedSession", "StatusTable", "choose_drafter",
    "AppendNeeded", "Discarded", "InvalidTransition", "Pending", "RoundDone", "ScoreNeeded", "State",
    "Uniforms", "VerifierSession",
]
