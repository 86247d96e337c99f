"""A vLLM-compatible model-server simulator (``epp sim``).

One process serves one simulated instance: the OpenAI completions/chat API in vLLM's
wire format, vLLM's Prometheus metrics, a queue bounded by ``--max-num-seqs``, a
block-hashed prefix cache and a simple latency model, so routing decisions can be
judged without GPUs.

Layout: ``config`` (SimConfig), ``prefix_cache`` (pure hashing + LRU), ``protocol``
(request parsing, pure), ``engine`` (admission queue and timing),
``responses`` (vLLM response bodies and SSE chunks, pure), ``metrics`` (Prometheus
exposition), ``server`` (aiohttp app), ``cli`` (process entry point).
"""

from epp.sim.config import SimConfig

__all__ = ["SimConfig"]
