"""Deployments: the roles wired together and started.

``local`` wires a router, a verifier and drafters in one process over the in-process
transport (``sdcp-fast generate``, the in-process demo, the benches); ``service`` runs one
role as a process on the HTTP/2 + mutual TLS transport (§5.1); ``catalog`` resolves models
and drafters by name for both; ``up`` supervises the embedded deployment on one machine.
"""
