"""Prefill/decode disaggregation: deciders (pure: is a separate prefill worth it?) and
coordinators (I/O: how the prefill and decode legs meet)."""
