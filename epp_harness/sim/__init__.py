"""A vLLM-compatible model-server simulator (``epp sim``).

One process serves one simulated instance: the OpenAI completions/chat API in vLLM's
wire format, vLLM's Prometheus metrics, a queue bounded by ``--max-num-seqs``, a
block-hashed prefix cache and a simple latency model, so routing decisions can be
judged without GPUs.

Layout: ``config`` (SimConfig), ``prefix_cache`` (chained block hashes, pure),
``block_pool`` and ``kv_cache`` (vLLM's KV block pool and its requests, pure),
``protocol`` (request parsing, pure), ``engine`` (admission queue and timing),
``responses`` (vLLM response bodies and SSE chunks, pure), ``metrics`` (Prometheus
exposition), ``server`` (aiohttp app), ``flags`` (the CLI flags), ``cli`` (process
entry point). Prefill/decode handoffs: ``kv_params`` (P/D request fields, pure),
``handoff`` (the KV connector: what each request does), ``kv_holds`` (NIXL blocks
awaiting a pull), ``bootstrap`` (SGLang rendezvous rooms), ``kv_pool`` (the shared
directory pool), ``kv_routes`` (the pull and join routes prefill instances serve).
"""

from epp_harness.sim.config import SimConfig

__all__ = ["SimConfig"]
