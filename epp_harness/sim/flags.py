"""The flags of ``epp sim`` and the SimConfig they build (no I/O)."""

from __future__ import annotations

import argparse

from epp.common import argtypes
from epp.observability.logsetup import add_log_level
from epp.types import Role
from epp_harness.sim.config import METRICS_DIALECTS, KvConnector, SimConfig, address
from epp_harness.sim.faults import parse_fault_metrics, parse_fault_status
from epp_harness.sim.lora import parse_lora_module


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``epp sim`` (process-level settings only; all have defaults)."""
    d = SimConfig()
    add = parser.add_argument
    add("--host", default=d.host, help="address to listen on")
    add(
        "--port", type=argtypes.port, default=d.port, help="port to listen on (0 = pick a free one)"
    )
    add(
        "--ready-file",
        default=None,
        metavar="PATH",
        help="write {host, port, url, instance[, orca_port][, bootstrap_port]"
        "[, kv_events_port][, kv_events_replay_port]} here once bound",
    )
    add("--model", default=d.model, help="the served model name")
    add("--instance-id", default=None, help="name in x-sim-instance (default: host:port)")
    add(
        "--max-num-seqs",
        type=argtypes.positive_int,
        default=d.max_num_seqs,
        help="sequences running at once; the rest wait FIFO",
    )
    add(
        "--kv-blocks",
        type=argtypes.positive_int,
        default=d.kv_blocks,
        help="KV blocks in the pool, one of them reserved (vLLM's --num-gpu-blocks-override)",
    )
    add(
        "--block-size", type=argtypes.positive_int, default=d.block_size, help="tokens per KV block"
    )
    add(
        "--prefill-overhead-ms",
        type=argtypes.non_negative_float,
        default=d.prefill_overhead_ms,
        help="fixed prefill cost per request",
    )
    add(
        "--prefill-ms-per-token",
        type=argtypes.non_negative_float,
        default=d.prefill_ms_per_token,
        help="prefill cost per uncached prompt token",
    )
    add(
        "--decode-ms-per-token",
        type=argtypes.non_negative_float,
        default=d.decode_ms_per_token,
        help="base inter-token latency",
    )
    add(
        "--itl-ms-per-running-seq",
        type=argtypes.non_negative_float,
        default=d.itl_ms_per_running_seq,
        help="inter-token latency added per running sequence",
    )
    add(
        "--max-num-batched-tokens",
        type=argtypes.non_negative_int,
        default=d.max_num_batched_tokens,
        help="token budget of one forward step shared by decodes and chunked prefills, as "
        "vLLM's flag (a long prefill then slows the decodes in its steps); 0 = per-request "
        "timing without interference (docs/simulator.md)",
    )
    add(
        "--default-max-tokens",
        type=argtypes.positive_int,
        default=d.default_max_tokens,
        help="tokens generated when the request sets no max_tokens",
    )
    add(
        "--time-scale",
        type=argtypes.non_negative_float,
        default=d.time_scale,
        help="multiplies every simulated latency (0 = answer instantly)",
    )
    add(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens (the prompt tokens the prefix "
        "cache or a KV transfer served without prefill), as vLLM's flag of that name; off "
        "by default, as in vLLM",
    )
    # ORCA load reports (epp_harness.sim.orca)
    add(
        "--orca-format",
        type=str.lower,
        choices=["none", "text", "json", "bin"],
        default=d.orca_format,
        help="add an endpoint-load-metrics header in this format to every non-streaming "
        "response (a request's endpoint-load-metrics-format header overrides it)",
    )
    add(
        "--orca-port",
        type=argtypes.port,
        default=None,
        metavar="PORT",
        help="serve ORCA OpenRcaService/StreamCoreMetrics (gRPC) on this port "
        "(0 = pick a free one; not given = off)",
    )
    add(
        "--metrics-dialect",
        type=str.lower,
        choices=list(METRICS_DIALECTS),
        default=d.metrics_dialect,
        help="whose metric names /metrics uses: vLLM's, SGLang's or TensorRT-LLM's "
        "(queue, running batch, KV usage, cache geometry, TTFT)",
    )
    _add_disaggregation_arguments(parser, d)
    _add_kv_event_arguments(parser, d)
    _add_lora_arguments(parser, d)
    _add_fault_arguments(parser, d)
    add_log_level(parser)


def _add_kv_event_arguments(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    group = parser.add_argument_group(
        "KV events",
        "publish what the prefix cache stores and evicts as vLLM does with "
        "--kv-events-config (ZMQ PUB, msgpack; docs/kv-events.md). With events on, "
        "prompts are tokenized by the simulator's own tokenizer (one token per UTF-8 "
        "byte; chat through its own template), so blocks hold --block-size bytes and "
        "usage counts those tokens; POST /tokenize answers with the same ids either way",
    )
    add = group.add_argument
    add(
        "--kv-events-port",
        type=argtypes.port,
        default=None,
        metavar="PORT",
        help="bind the PUB socket on --host:PORT (0 = a free one, named in the ready file; "
        "not given = no events)",
    )
    add(
        "--kv-events-replay-port",
        type=argtypes.port,
        default=None,
        metavar="PORT",
        help="also serve replays of buffered messages on this port (vLLM's "
        "replay_endpoint: a ROUTER socket; 0 = a free one)",
    )
    add(
        "--kv-events-topic",
        default=d.kv_events_topic,
        metavar="TOPIC",
        help="topic frame of every message (default: empty, as vLLM's)",
    )
    add(
        "--write-tokenizer",
        default=None,
        metavar="DIR",
        help="write the tokenizer this instance counts with as tokenizer.json and "
        "tokenizer_config.json (with its chat template) into DIR at start: with KV events "
        "the byte tokenizer, for the EPP's precise-prefix-cache-scorer `tokenizer` "
        "parameter; without, the 4-characters-per-token one, for a benchmark client "
        "(docs/simulator.md#tokenizers)",
    )


def _add_lora_arguments(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    group = parser.add_argument_group(
        "LoRA adapters", "as vLLM serves them (docs/lora.md): requests name an adapter as model"
    )
    add = group.add_argument
    add(
        "--enable-lora",
        action="store_true",
        help="serve LoRA adapters: /v1/load_lora_adapter, /v1/unload_lora_adapter, "
        "adapters in /v1/models, vllm:lora_requests_info",
    )
    add(
        "--max-loras",
        type=argtypes.positive_int,
        default=d.max_loras,
        help="adapters that can be active at once (GPU slots); a request whose adapter "
        "finds every slot busy with others waits",
    )
    add(
        "--lora-modules",
        nargs="+",
        type=argtypes.checked(parse_lora_module),
        default=[],
        metavar="NAME=PATH",
        help="adapters registered at start (implies --enable-lora)",
    )
    add(
        "--lora-swap-ms",
        type=argtypes.non_negative_float,
        default=d.lora_swap_ms,
        help="time an adapter takes to enter a full slot table (evicting the least "
        "recently used idle one), scaled by --time-scale",
    )


def _add_fault_arguments(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    group = parser.add_argument_group(
        "injected faults", "for fault tests; also settable at runtime with POST /sim/faults"
    )
    add = group.add_argument
    add(
        "--fault-status",
        type=argtypes.checked(parse_fault_status),
        default=None,
        metavar="STATUS:SHARE[,...]",
        help="answer this share of generation requests with STATUS in vLLM's error shape "
        "(e.g. 503:0.2,404:0.1; message 'injected fault ...')",
    )
    add(
        "--fault-metrics",
        type=argtypes.checked(parse_fault_metrics),
        default=d.fault_metrics.spec,
        metavar="{ok,fail,slow:SECONDS}",
        help="/metrics answers 503 (fail) or only after SECONDS (slow, wall time)",
    )
    add(
        "--fault-seed",
        type=argtypes.non_negative_int,
        default=d.fault_seed,
        help="seed of the draws that pick which requests --fault-status answers, one per "
        "generation request in arrival order",
    )


def _add_disaggregation_arguments(parser: argparse.ArgumentParser, d: SimConfig) -> None:
    group = parser.add_argument_group(
        "prefill/decode disaggregation", "how this instance takes part in a P/D split"
    )
    add = group.add_argument
    add(
        "--role",
        type=argtypes.checked(Role.parse),
        default=d.role,
        metavar="{prefill,decode,prefill-decode}",
        help="the instance's P/D role ('both' = prefill-decode); it decides which side of "
        "an sglang/mooncake rendezvous it takes and whether it writes or reads a KV pool",
    )
    add(
        "--kv-connector",
        type=str.lower,
        choices=[c.value for c in KvConnector],
        default=d.kv_connector.value,
        help="how KV moves between instances: nixl (vLLM: the decode pulls the blocks named "
        "in kv_transfer_params), sglang or mooncake (bootstrap rendezvous, both legs at "
        "once), pool (a KV pool shared through --kv-pool-dir)",
    )
    add(
        "--kv-hold-seconds",
        type=argtypes.non_negative_float,
        default=d.kv_hold_seconds,
        help="nixl: how long a prefill keeps its blocks for a decode to pull (wall time)",
    )
    add(
        "--kv-transfer-ms-per-token",
        type=argtypes.non_negative_float,
        default=d.kv_transfer_ms_per_token,
        help="decode cost per prompt token whose KV is received instead of computed",
    )
    add(
        "--bootstrap-timeout-seconds",
        type=argtypes.non_negative_float,
        default=d.bootstrap_timeout_seconds,
        help="sglang/mooncake: how long either side waits in a bootstrap room; nixl: the "
        "pull's timeout (wall time)",
    )
    add(
        "--bootstrap-port",
        type=argtypes.port,
        default=None,
        metavar="PORT",
        help="sglang/mooncake prefill: also serve the rendezvous on this port (0 = pick a "
        "free one; not given: the HTTP port only)",
    )
    add(
        "--kv-pool-dir",
        default=None,
        metavar="DIR",
        help="pool: the directory every instance of the deployment shares as its KV pool "
        "(created on first write; required with --kv-connector pool)",
    )


def config_from_args(args: argparse.Namespace, port: int) -> SimConfig:
    """The SimConfig for parsed flags, given the port actually bound."""
    return SimConfig(
        model=args.model,
        instance_id=args.instance_id or address(args.host, port),
        host=args.host,
        port=port,
        max_num_seqs=args.max_num_seqs,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        prefill_overhead_ms=args.prefill_overhead_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        itl_ms_per_running_seq=args.itl_ms_per_running_seq,
        max_num_batched_tokens=args.max_num_batched_tokens,
        default_max_tokens=args.default_max_tokens,
        time_scale=args.time_scale,
        orca_format=args.orca_format,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        role=args.role,
        kv_connector=KvConnector(args.kv_connector),
        kv_hold_seconds=args.kv_hold_seconds,
        bootstrap_timeout_seconds=args.bootstrap_timeout_seconds,
        kv_transfer_ms_per_token=args.kv_transfer_ms_per_token,
        kv_pool_dir=args.kv_pool_dir,
        bootstrap_port=args.bootstrap_port,
        kv_events_port=args.kv_events_port,
        kv_events_replay_port=args.kv_events_replay_port,
        kv_events_topic=args.kv_events_topic,
        enable_lora=args.enable_lora or bool(args.lora_modules),
        max_loras=args.max_loras,
        lora_modules=tuple(args.lora_modules),
        lora_swap_ms=args.lora_swap_ms,
        metrics_dialect=args.metrics_dialect,
        fault_status=args.fault_status or (),
        fault_metrics=args.fault_metrics,
        fault_seed=args.fault_seed,
    )
