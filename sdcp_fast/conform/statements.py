"""Every check of the conformance kit, with the sentence of the draft it exercises.

Each quote is the draft's text, verbatim up to runs of white space
(tests/conform/test_statements.py holds them against the draft). A check's outcome is one of
pass, fail, not reachable, or interpretation (sdcp_fast/conform/report.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    id: str
    section: str
    statement: str  # what the kit checks, in short
    quote: str  # the draft's sentence


_TLS = ("HTTP/2 [RFC9113] or HTTP/3 [RFC9114] over TLS 1.3 [RFC8446] with mutual certificate "
        "authentication is REQUIRED.")
_AUTH = ("Authorization: the authenticated client MUST be the drafter named in the latest assignment the "
         "verifier received for the session; otherwise respond 403 with problem type \"sdcp-not-assigned\".")
_BASE = ("Base check: if base is not the committed length or base_digest is not d[base], respond 409 with "
         "problem type \"sdcp-stale-base\" and the current session-state, so that the drafter can resynchronize.")
_LIMIT = "sdcp-limit 422 Proposal violates m_cap or m_max"
_LADDER = ("When c reaches R, the verifier applies entry j of the fallback list (skipping entries that are not "
           "permitted, as described for self_decode, and advancing j past every entry it applies or skips), "
           "then resets c to zero.")
_SELF = ("Each token committed during self-decoding is recorded as a round of its own, with no proposal, so "
         "round numbers stay consecutive.")
_RESUME = ("it then reads the last commit record and opens the session at a new verifier with that epoch and "
           "the \"resume\" member carrying that round, committed length, digest, and the target KV cache from "
           "the MLC if available.")
_OLD_EPOCH = ("Proposals carrying an older epoch are rejected, and front ends discard output carrying an older "
              "epoch, so a recovered old verifier cannot extend the session.")

_ALL = [
    # §4.1, §4.2
    Check("reference-digests", "4.1/4.2", "the kit's own digests (and §6.4 draws) reproduce the published "
          "vectors",
          "The contract digest is the SHA-256 of the contract encoded with the core deterministic encoding of "
          "Section 4.2.1 of [RFC8949], prefixed with a domain separator:"),
    Check("valid-contracts", "4.1/4.2", "published valid contracts open a session whose d[0] follows the "
          "contract digest (or are refused as not supported: interpretation)",
          "The contract digest is computed once, over the contract as created."),
    Check("invalid-contracts", "4.1", "published invalid contracts are refused with sdcp-bad-contract",
          "sdcp-bad-contract 422 Contract invalid or not supported"),
    Check("unknown-contract-key", "4.1", "a contract with an undefined key is 422 sdcp-bad-contract",
          "A contract that contains a key not defined by this document MUST be rejected with problem type "
          "\"sdcp-bad-contract\", so that all parties compute the contract digest over the same content."),
    Check("m-max-65", "4.1", "m_max 65 (outside uint .le 64) is 422 sdcp-bad-contract",
          "m_max: uint .le 64, ; upper bound on M"),
    Check("wrong-target", "6.1", "a contract for another target is 422 sdcp-bad-contract",
          "The verifier validates the contract (it MUST refuse a contract whose target digest does not match "
          "its model)"),
    # §5.1, §5.2
    Check("tls13-only", "5.1", "a client offering only TLS 1.2 gets no service", _TLS),
    Check("mutual-tls", "5.1", "a client without a certificate gets no service", _TLS),
    Check("h2-only", "5.1", "a client offering only HTTP/1.1 gets no service; h2 is negotiated", _TLS),
    Check("media-type", "5.1", "every message body answered is application/sdcp+cbor",
          "Message bodies use the media type \"application/sdcp+cbor\"."),
    Check("problem-details", "5.1", "errors are Problem Details (a malformed body: 4xx)",
          "Errors use Problem Details [RFC9457]; clients handle unlisted status codes by class [RFC9110]."),
    Check("router-only", "5.1/6.1", "a drafter certificate cannot open sessions or change a policy "
          "(the draft names no certificate roles: served is an interpretation)", _TLS),
    Check("unknown-keys", "5.2", "unknown keys outside the contract are ignored",
          "Unknown map keys MUST be ignored, except in the contract (Section 4.1)."),
    Check("unknown-action", "5.2", "an unknown action in the fallback list is applied as fail (or the contract "
          "refused: interpretation)",
          "A receiver that encounters an unknown action value MUST treat it as \"fail\"."),
    # §6.1
    Check("open-state", "6.1", "session-open answers session-state: round 0, committed 0, d[0]",
          "computes d[0], and answers with session-state (round 0, committed 0)."),
    Check("unknown-session", "6.1", "a session the verifier does not hold is a 4xx problem",
          "Errors use Problem Details [RFC9457]; clients handle unlisted status codes by class [RFC9110]."),
    Check("assigned-only", "6.1/6.3", "a proposal from a drafter other than the assigned one is 403 "
          "sdcp-not-assigned", _AUTH),
    Check("router-proposes", "6.3", "a router certificate posting a proposal is 403 sdcp-not-assigned", _AUTH),
    Check("auth-before-fencing", "6.3", "a proposal of another epoch from a drafter not assigned is 403 "
          "sdcp-not-assigned (authorization comes before fencing)",
          "On receiving a proposal, the verifier performs these steps:"),
    # §6.3
    Check("stale-epoch", "6.3", "a proposal of another epoch is 409 sdcp-stale-epoch",
          "Fencing: if epoch differs from the session epoch, respond 409 with problem type \"sdcp-stale-epoch\"."),
    Check("stale-base", "6.3", "a wrong base or base_digest is 409 sdcp-stale-base", _BASE),
    Check("stale-round", "6.3", "a round that is not the last round plus one is 409 sdcp-stale-base",
          "If round is not the last round plus one, respond 409 likewise."),
    Check("stale-state", "6.3", "each 409 sdcp-stale-base carries the current session-state, exactly "
          "(any member name)", _BASE),
    Check("replay", "6.3", "a replayed proposal gets its verdict unchanged",
          "Idempotency: if a verdict for this round already exists, return it unchanged;"),
    Check("identical-in-progress", "6.3", "two identical concurrent proposals get the same verdict",
          "if the round is being verified for an identical earlier request, wait for that verdict and return it."),
    Check("limit-m-max", "6.2/6.5.1", "M above m_max is 422 sdcp-limit", _LIMIT),
    Check("limit-m-cap", "6.2/6.5.1", "M above m_cap (below m_max) is 422 sdcp-limit", _LIMIT),
    Check("refused-commits-nothing", "6.3", "a refused proposal commits nothing: the same round is verified next",
          "only after that append succeeds does it send the verdict and make the tokens available as output."),
    Check("verdict-chain", "4.2/6.3", "every verdict: a <= M, emitted begins with the accepted tokens, n, "
          "d[n], round and epoch follow",
          "d[k] = SHA-256( d[k-1] || uint32(o[k]) ) for k = 1..n"),
    Check("truncate-max-new", "6.3", "emitted tokens stop at max_new, with finish",
          "It truncates the emitted tokens after the first stop token and at max_new."),
    Check("truncate-stop", "6.3", "emitted tokens stop after the first stop token, with finish",
          "It truncates the emitted tokens after the first stop token and at max_new."),
    Check("closed-after-finish", "6.5.2", "after finish, a proposal is 410 sdcp-session-closed",
          "sdcp-session-closed 410 Session has finished or failed"),
    # §6.4
    Check("rule1-exact", "6.4", "rule 1: each verdict's accepted and emitted tokens are greedy decoding, "
          "whatever is proposed",
          "The output is identical to greedy decoding of the target model as computed by the verifier's scoring "
          "passes, whatever the drafter proposes."),
    Check("rule2-needs-q", "6.4", "rule 2: a proposal without q_rows is refused (4xx)",
          "The proposal MUST carry q_rows;"),
    Check("rule2-q-zero", "6.4", "rule 2: q(x) = 0 is 422 sdcp-bad-proposal",
          "a proposal for which q[i](x[i]) is zero is rejected, before any random draw, with problem type "
          "\"sdcp-bad-proposal\"."),
    Check("rule2-q-unavailable", "6.3", "rule 2: rows that cannot be read are 409 sdcp-q-unavailable",
          "If it cannot obtain them, it rejects the round with problem type \"sdcp-q-unavailable\" and commits "
          "nothing."),
    Check("rule2-temperature-0", "4.1/6.4", "rule 2 at temperature 0, uniform q: every verdict exactly "
          "(greedy token accepted, any other rejected and replaced by the greedy one)",
          "At the first rejected position, the additional token is drawn from the normalized residual "
          "distribution max(0, p[i] - q[i])."),
    Check("rule2-seeded", "6.4", "rule 2 with a seed, above temperature 0 (with an oracle of the target's "
          "logits): the accepted count follows the HMAC draws exactly; the additional token has weight",
          "When the sampling profile contains a seed, the verifier derives each value from HMAC-SHA-256 "
          "[RFC2104] keyed with the seed"),
    # §6.5
    Check("m-cap-range", "6.5.1", "every verdict's m_cap is within 1..m_max",
          "Each verdict carries m_cap, the largest M the drafter may use in the next round, with "
          "1 <= m_cap <= m_max."),
    Check("m-cap-restore", "6.5.1", "m_cap grows back after rounds that are not low (SHOULD)",
          "It SHOULD restore m_cap gradually (for example by one per round) when rounds are no longer low and "
          "its load permits."),
    Check("m-cap-load", "6.5.1", "m_cap lowered under load",
          "The verifier lowers m_cap when its own load makes long proposals costly"),
    Check("low-counter", "6.5.2", "each verdict's low is the count of consecutive low rounds",
          "After a low round, c is incremented and g reset; after a round that is not low, c is reset and g "
          "incremented, and when g reaches R, where R is low_rounds, j is reset to zero."),
    Check("ladder", "6.5.2", "each verdict's action is the ladder's: entry j when c reaches R, j advancing",
          _LADDER),
    Check("ladder-exhausted", "6.5.2", "with no entry left the action is fail, and the output ends with fail",
          "If no entry remains, it applies \"fail\"."),
    Check("reduce-halves", "6.5.2", "reduce sets m_cap to max(1, floor(m_cap / 2))",
          "The verifier sets m_cap to max(1, floor(m_cap / 2)) and the drafter proceeds."),
    Check("switch-reassign", "6.5.2", "after switch the session goes on with the drafter of a new assignment",
          "The verifier sends an event to the router, which assigns the session to another drafter with a "
          "permitted model;"),
    Check("self-decode", "6.5.2", "self_decode: the verifier commits greedy tokens one per round, stops after "
          "self_max, round numbers consecutive", _SELF),
    Check("events", "6.5.2", "switch, self_decode, finish and fail send an event to the router",
          "The verifier sends an event to the router"),
    # §6.6
    Check("policy-from-round", "6.6", "a policy takes effect from from_round (with an oracle), not before",
          "The verifier applies the new profile to rounds numbered from_round and later,"),
    Check("policy-past-round", "6.6", "a policy for a round not after the current one is refused "
          "(accepted: interpretation)",
          "It sends a policy message with from_round greater than the current round."),
    # §6.7
    Check("output", "6.7", "output from n is the committed tokens from index n, with the epoch; final with finish",
          "The final output message has final set to true and finish set to \"finish\" or \"fail\"."),
    Check("output-wait", "6.7", "a waiting GET output returns nothing but committed tokens",
          "Committed tokens are delivered with GET output?from=n, which returns the tokens committed at output "
          "indices n and later, waiting up to a server-chosen time if none are available."),
    # §6.8, §6.9
    Check("fenced", "6.8/6.3", "after a fence record of a higher epoch the verifier commits nothing, releases "
          "nothing and stops serving the session",
          "If the append fails because the log has been fenced, the verifier MUST discard the round, release no "
          "output, and stop serving the session."),
    Check("resume", "6.9", "a session-open at a higher epoch with resume answers that round, length and digest, "
          "and goes on from them", _RESUME),
    Check("lower-epoch-open", "6.9", "a session-open at a lower epoch is 409 sdcp-stale-epoch and changes nothing",
          _OLD_EPOCH),
    Check("old-epoch-proposal", "6.9", "after a re-open, proposals of the older epoch are 409 sdcp-stale-epoch",
          _OLD_EPOCH),
    Check("assignment-stale-epoch", "6.9", "an assignment of another epoch takes no effect",
          _OLD_EPOCH),
    Check("drafter-failover", "6.9", "after a new assignment, the former drafter's proposals are 403 "
          "sdcp-not-assigned",
          "Proposals from the failed drafter are rejected because it is no longer the assigned drafter."),
]

# ``--role drafter`` and ``--role router``: what a client can see of those roles from outside.
_OTHER_ROLES = [
    Check("drafter-router-only", "5.1/6.1", "a drafter certificate cannot send a drafter assignments "
          "(the draft names no certificate roles: served is an interpretation)", _TLS),
    Check("drafter-problem-details", "5.1", "a malformed assignment is a 4xx Problem Details answer",
          "Errors use Problem Details [RFC9457]; clients handle unlisted status codes by class [RFC9110]."),
    Check("drafter-outstanding", "6.2", "one outstanding proposal per session; M within min(m_max, m_cap)",
          "A drafter MUST NOT have more than one outstanding proposal per session."),
    Check("router-status-self", "6.1", "a drafter certificate cannot report another instance's status "
          "(served is an interpretation)", _TLS),
    Check("router-events-role", "5.1/6.5.2", "a drafter certificate cannot send events (served is an "
          "interpretation)", _TLS),
    Check("router-expired", "6.1", "no assignment to an instance whose status expired",
          "The router MUST NOT assign sessions to an instance whose status has expired."),
    Check("router-fence-first", "6.9", "the router fences the commit log before a fail-over",
          "the router first appends a fence record with the new epoch to the commit_log"),
]
_ALL += _OTHER_ROLES
OTHER_ROLES = frozenset(c.id for c in _OTHER_ROLES)

CHECKS: dict[str, Check] = {c.id: c for c in _ALL}
assert len(CHECKS) == len(_ALL), "check ids are unique"

__all__ = ["CHECKS", "OTHER_ROLES", "Check"]
