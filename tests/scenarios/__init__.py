"""The scenario matrix: deployment shape x fault schedule x workload, generated from a
seed, run against real Envoy + EPP + simulators, checked against invariants
(docs/testing.md)."""
