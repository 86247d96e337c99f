"""The plugins and scheduling profiles the EPP runs when a config declares none.

Written as the YAML would be, and only what differs from each plugin's own defaults
(those stay in its factory; `epp config show` prints them filled in): decode picks
weigh queue, KV-cache headroom, in-flight load and cached prefix; prefill picks drop
KV headroom (it matters where tokens decode); the P/D handler asks for a separate
prefill when enough of the prompt is uncached on the decode pick. Both profiles send a
request naming a LoRA adapter where the adapter is active, else where a slot is free
(epp.scheduling.plugins.lora; inactive where no server reports LoRA state).
"""

from __future__ import annotations

from typing import Any

PLUGINS: tuple[dict[str, Any], ...] = (
    {"type": "pd-profile-handler", "parameters": {"prefixPlugin": "prefix-cache-scorer"}},
    {"type": "decode-filter"},
    {"type": "prefill-filter"},
    {"type": "lora-affinity-filter"},
    {"type": "queue-scorer", "parameters": {"normalize": "threshold"}},
    {"type": "kv-cache-utilization-scorer"},
    {"type": "in-flight-load-scorer"},
    {"type": "prefix-cache-scorer"},
    {"type": "lora-affinity-scorer"},
    {"type": "max-score-picker", "parameters": {"maxTargets": 3}},
)

PROFILES: tuple[dict[str, Any], ...] = (
    {
        "name": "decode",
        "plugins": [
            {"pluginRef": "decode-filter"},
            {"pluginRef": "lora-affinity-filter"},
            {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "in-flight-load-scorer", "weight": 1},
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "lora-affinity-scorer", "weight": 4},
            {"pluginRef": "max-score-picker"},
        ],
    },
    {
        "name": "prefill",
        "plugins": [
            {"pluginRef": "prefill-filter"},
            {"pluginRef": "lora-affinity-filter"},
            {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "in-flight-load-scorer", "weight": 1},
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "lora-affinity-scorer", "weight": 4},
            {"pluginRef": "max-score-picker"},
        ],
    },
)
