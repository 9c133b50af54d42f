"""The three SDCP roles as plain objects behind one handler each (docs/roles.md).

``verifier`` (built from ``verifier_config``, with ``verifier_state``, ``verifier_open``,
``verifier_batch`` and its ``verifier_plan``, ``verifier_commit``, ``verifier_kv`` and
``scoring``), ``drafter`` (its q rows in ``drafter_q_rows``) and ``router`` (with its
OpenAI-compatible front end: ``frontend``, ``frontend_requests``, ``frontend_text``,
``frontend_server``, ``sse``).
``wire`` maps Table 1 onto any transport; ``objects`` is how the roles use the store;
``load``, ``metrics`` and ``retry`` are shared by all three. Every protocol decision
is the core's (:mod:`sdcp_fast.protocol`); no role knows which transport called it.
"""
