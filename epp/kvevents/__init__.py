"""What model servers report about their own KV cache (vLLM's KV events), as pure data:
the wire format (:mod:`.wire`), where each endpoint publishes (:mod:`.settings`) and the
index of blocks each endpoint holds (:mod:`.index`). The subscriber that reads the
sockets lives at the I/O edge, in :mod:`epp.datalayer.kvevents`; docs/kv-events.md
describes the whole."""
