"""Prefill/decode disaggregation's I/O: coordinators (how the prefill and decode legs
meet), their HTTP legs and bodies, and the decode-side sidecar. Whether a separate prefill
is worth it is decided in :mod:`epp.scheduling.deciders` (pure)."""
