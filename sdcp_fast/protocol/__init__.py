"""The SDCP protocol core: pure, synchronous, no I/O, no clock, no torch.

The roles (:mod:`sdcp_fast.roles`) are thin adapters around it: decode bytes, call the core,
encode; the transports carry the bytes.
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
    instance_path_id,
    parse_instance_path_id,
    parse_session_path_id,
    session_path_id,
)
from sdcp_fast.protocol.peer import Peer, PeerRole, peer_from_uris, require_role
from sdcp_fast.protocol.problems import (
    BadContract,
    BadProposal,
    BadRequest,
    Forbidden,
    Limit,
    NotAssigned,
    QUnavailable,
    SdcpProblem,
    SessionClosed,
    StaleBase,
    StaleEpoch,
    UnknownSession,
    UnlistedProblem,
    problem_from_response,
)
from sdcp_fast.protocol.randoms import VerifierRandom, verifier_uniform

__all__ = [
    "deterministic_cbor", "contract_digest", "prefix_digest", "extend_digest", "verifier_uniform",
    "VerifierRandom", "MEDIA_TYPE", "session_path_id", "parse_session_path_id", "instance_path_id",
    "parse_instance_path_id", "Peer", "PeerRole", "peer_from_uris", "require_role",
    "Action", "Assignment", "Contract", "Event", "Output", "Policy", "Proposal", "Resume", "Sampling",
    "SessionOpen", "SessionState", "Status", "Verdict",
    "BadContract", "BadProposal", "BadRequest", "Limit", "NotAssigned", "QUnavailable", "SdcpProblem",
    "SessionClosed", "StaleBase", "StaleEpoch", "UnknownSession", "Forbidden", "UnlistedProblem",
    "problem_from_response",
]

# The roles' state machines and rules (verifier session, control, acceptance, drafter, router).
from sdcp_fast.protocol.acceptance import RoundResult, greedy, profile_distribution, speculative  # noqa: E402
from sdcp_fast.protocol.control import SpeculationControl  # noqa: E402
from sdcp_fast.protocol.drafting import AcceptanceEstimator, DrafterSession, choose_m  # noqa: E402
from sdcp_fast.protocol.registry import SessionRegistry  # noqa: E402
from sdcp_fast.protocol.routing import RoutedSession, new_session_id  # noqa: E402
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
from sdcp_fast.protocol.status_table import StatusTable, choose_drafter, choose_verifier  # noqa: E402

__all__ += [
    "RoundResult", "greedy", "profile_distribution", "speculative", "SpeculationControl",
    "AcceptanceEstimator", "DrafterSession", "choose_m", "RoutedSession", "StatusTable", "choose_drafter",
    "choose_verifier", "new_session_id", "SessionRegistry",
    "AppendNeeded", "Discarded", "InvalidTransition", "Pending", "RoundDone", "ScoreNeeded", "State",
    "Uniforms", "VerifierSession",
]
