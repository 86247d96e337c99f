"""Shared building blocks at the bottom of the layers: host:port addresses and flag
types, the entry-point registries, health statuses, background loop tasks, the ready and
state files, restart backoff, and the request-body helpers (parsing, usage, the engine's
tokenization). They import nothing of the EPP's but each other, ``epp.types`` and
``epp.errors``."""
