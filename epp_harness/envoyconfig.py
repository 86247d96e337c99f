"""Envoy bootstrap configs, built as plain data (pure).

One builder serves ``epp stack``, the committed files under ``envoy/``, the tests and the
benchmarks, so the configs cannot drift apart. ``processing`` picks how much of each
request Envoy shows the EPP:

* ``full``: request headers + FULL_DUPLEX_STREAMED body (trailers SEND, as Envoy
  requires), response headers + FULL_DUPLEX_STREAMED body (trailers SEND). The EPP sees
  status, usage, end of stream, and can end a stream whose server went silent.
* ``lean``: the request path as in ``full``; on the response path the headers, no body,
  trailers SEND. Fewer ext_proc messages per request (cheaper), but no usage counting.
  Trailers must stay SEND: with SKIP, Envoy 1.40 closes the ext_proc stream right after
  the response headers, so the EPP would lose sight of a streaming response's end and
  its in-flight counts would drop while the response is still streaming (measured).
* ``buffered``: ``lean``'s response side, and the request body BUFFERED: Envoy sends the
  whole body in one message and the EPP routes in its answer to it, without echoing the
  body back (half the bytes through the EPP, fewer messages). The EPP cannot rewrite
  the body in this mode, and bodies must fit Envoy's buffer limit
  (``per_connection_buffer_limit_bytes``, 32 MiB here).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from epp.common.addresses import is_ip
from epp.common.health import EXT_PROC_SERVICE
from epp.extproc.messages import (
    DESTINATION_HEADER,
    LB_NAMESPACE,
    RETRY_404_HEADER,
    STREAM_HEADER,
)
from epp.extproc.stream import UPSTREAM_ADDRESS
from epp.extproc.transport import MAX_DESTINATIONS_METADATA
from epp.xds.eds import MODEL_CLUSTER

Processing = Literal["full", "lean", "buffered"]
PROCESSING_MODES: tuple[Processing, ...] = ("full", "lean", "buffered")
# How Envoy finds the model servers: "eds" (the EPP serves the cluster's endpoints over
# EDS; the override_host policy reads the EPP's ordered fallback list and a retry moves
# to the next one on connect failure or reset, or a LoRA adapter's 404) or
# "original-dst" (Envoy connects to the one address in the header; no failover, nothing
# to serve).
ClusterKind = Literal["eds", "original-dst"]
CLUSTER_KINDS: tuple[ClusterKind, ...] = ("eds", "original-dst")

_HCM = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_PREVIOUS_HOSTS = (
    "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
)
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_OVERRIDE_HOST = (
    "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"
)
_LEAST_REQUEST = (
    "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"
)
FALLBACK_CLUSTER = "model_servers_fallback"
_HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_CEL_FILTER = "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"

BUFFER_LIMIT_BYTES = 32 * 1024 * 1024
# Retries a cluster may have under way at once. Envoy's default circuit breaker allows 3:
# when a server dies or freezes under load, every request routed to it retries at the
# same moment, and past the third the client got the failed try's 503 or 504 (the
# scenario matrix's bursts: seed 1156). Each request still retries at most its route's
# num_retries times; this is Envoy's default for requests under way, so a retry is
# refused only where a new request would be.
MAX_RETRIES_UNDER_WAY = 1024
_RETRY_BREAKER = {"thresholds": [{"priority": "DEFAULT", "max_retries": MAX_RETRIES_UNDER_WAY}]}
# gRPC health checks of the ext_proc cluster when it lists several EPP addresses
EPP_HEALTH_INTERVAL_S = 0.5
EPP_HEALTH_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class EnvoyOptions:
    listen_host: str = "127.0.0.1"
    listen_port: int = 8081
    admin_host: str = "127.0.0.1"
    admin_port: int = 9901
    epp_host: str = "127.0.0.1"
    epp_port: int = 9002
    # further EPP gRPC addresses (the workers of one EPP, or other replicas): the
    # ext_proc cluster spreads streams over all of them, (epp_host, epp_port) first
    more_epps: tuple[tuple[str, int], ...] = ()
    processing: Processing = "full"
    # Every timeout below is explained, with how they nest, in docs/timeouts.md.
    # How long Envoy waits for each EPP reply; the EPP holds the header reply until the
    # whole body is in (and a prefill leg has run), so this bounds body upload time +
    # scheduling. Kept short (an EPP that hangs fails requests soon); the EPP extends it
    # for one request when it holds it in flow control, loads its LoRA adapter or runs a
    # prefill leg (override_message_timeout), up to max_message_timeout_s.
    message_timeout_s: float = 10.0
    max_message_timeout_s: float = 300.0
    # Fail closed by default. Fail open (True): when the EPP cannot be reached, requests
    # go on without its pick, by the fallback route (docs/operations.md, "Fail-open").
    failure_mode_allow: bool = False
    # where fail-open requests go (round robin); empty: the EDS cluster's endpoints as
    # Envoy last had them (its override_host fallback picks the least loaded)
    fallback_servers: tuple[tuple[str, int], ...] = ()
    # what the client gets when the EPP cannot be reached (an OpenAI-style JSON body)
    status_on_error: int = 503
    # the whole exchange, retries included
    route_timeout_s: float = 600.0
    # Per attempt: the longest silence from a model server before Envoy gives up on it
    # (retrying on the next endpoint if nothing has reached the client yet). A
    # non-streaming answer comes in one piece at the end, so this must exceed the
    # longest generation; a stream sends its headers at once and then a chunk per token.
    first_byte_timeout_s: float = 300.0
    stream_idle_timeout_s: float = 60.0
    cluster: ClusterKind = "eds"
    # eds: endpoints per request (primary + fallbacks); retries try each of them once
    destinations: int = 3
    connect_timeout_s: float = 1.0
    # eds: how soon Envoy reopens its EDS stream to the EPP after it broke (an EPP
    # restart): jittered backoff from the base interval, doubling up to the maximum
    eds_retry_base_s: float = 0.1
    eds_retry_max_s: float = 1.0
    # TLS to the EPP's gRPC port (ext_proc and EDS), without verifying its certificate
    # (the EPP's --tls-self-signed; the gateways' usual setting)
    epp_tls: bool = False
    # ext_proc streams end with a half-close (False: Envoy's default reset; benchmarks)
    graceful_close: bool = True


# Envoy ends every ext_proc stream with RST_STREAM unless told to half-close and wait
# for the server's trailers (1 s at most). A reset makes each request end in an
# exception on the EPP (grpclib: a traceback cycle per request, ~60 objects for the
# cyclic GC; gen-2 passes then paused the EPP for 40-70 ms every few seconds at
# 130 req/s of 220 KB prompts). Only the end of the side stream changes.
GRACEFUL_CLOSE = "envoy.reloadable_features.ext_proc_graceful_grpc_close"


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _static_cluster(
    name: str, endpoints: list[tuple[str, int]], http2: bool, connect_timeout_s: float
) -> dict[str, Any]:
    literal = all(is_ip(h) for h, _ in endpoints)
    cluster: dict[str, Any] = {
        "name": name,
        # Service names (docker-compose, Kubernetes) need DNS; IP literals do not.
        "type": "STATIC" if literal else "STRICT_DNS",
        "connect_timeout": _seconds(connect_timeout_s),
        "lb_policy": "ROUND_ROBIN",
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(h, p)}} for h, p in endpoints]}
            ],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _processing_mode(processing: Processing) -> dict[str, str]:
    mode = {
        "request_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_header_mode": "SEND",
        # full duplex, so that the EPP can end a stalled stream (epp.extproc.stall);
        # Envoy then needs trailers SEND
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "response_trailer_mode": "SEND",
    }
    if processing in ("lean", "buffered"):
        mode["response_body_mode"] = "NONE"  # trailers SEND keep the stream open (module doc)
    if processing == "buffered":
        mode["request_body_mode"] = "BUFFERED"
        mode["request_trailer_mode"] = "SKIP"
    return mode


def _bootstrap(
    opts: EnvoyOptions,
    http_filters: list[dict[str, Any]],
    clusters: list[dict[str, Any]],
    routes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    if routes is None:
        routes = [{"match": {"prefix": "/"}, "route": _route_action(opts)}]
    hcm: dict[str, Any] = {
        "@type": _HCM,
        "stat_prefix": "inference",
        "route_config": {
            "name": "inference",
            "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            *http_filters,
            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
        ],
    }
    return {
        "admin": {"address": _address(opts.admin_host, opts.admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "inference",
                    "address": _address(opts.listen_host, opts.listen_port),
                    "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _route_action(opts: EnvoyOptions) -> dict[str, Any]:
    return {"cluster": MODEL_CLUSTER, "timeout": _seconds(opts.route_timeout_s)}


def _routes(opts: EnvoyOptions) -> list[dict[str, Any]]:
    """Four routes that differ only in how long a model server may stay silent per
    attempt and in whether a 404 is retried: streaming requests (the EPP marks them with
    ``STREAM_HEADER``, and clears the route cache so Envoy matches again) and the rest,
    each with and without ``RETRY_404_HEADER``.

    ``per_try_idle_timeout`` resets on every byte either way, so it bounds the wait for
    the first byte and every gap after it. When it fires before any of the response has
    reached the client, the attempt is retried (``eds``: on the next endpoint of the
    EPP's list; ``reset`` covers it); after that, Envoy cuts the client's response.
    On streams it is therefore the first-byte budget (queue + prefill); with ``full``
    processing the EPP ends a stream that stalls after its first byte much sooner
    (``epp serve --stream-chunk-timeout``, epp.extproc.stall).
    The route's ``idle_timeout`` (Envoy's default: 5 min for every stream) is raised to
    the route timeout so that it never ends a request before its attempts have run.

    The EPP marks a request for a LoRA adapter with ``RETRY_404_HEADER``: its list holds
    only servers that have the adapter, so a 404 ("The model `x` does not exist.") from
    one that lost it is retried on the next holder instead of reaching the client
    (docs/lora.md#routing). Other 404s (an unknown model or path) are answered at once."""
    retries = opts.destinations if opts.cluster == "eds" else 0
    routes = []
    kinds = ((True, opts.stream_idle_timeout_s), (False, opts.first_byte_timeout_s))
    marked = (True, False) if retries else (False,)  # (no retries: nothing to mark)
    for (streaming, idle), retry_404 in itertools.product(kinds, marked):
        match: dict[str, Any] = {"prefix": "/"}
        marks = [STREAM_HEADER] * streaming + [RETRY_404_HEADER] * retry_404
        if marks:
            match["headers"] = [{"name": h, "present_match": True} for h in marks]
        action = _route_action(opts)
        action["idle_timeout"] = _seconds(opts.route_timeout_s)
        policy: dict[str, Any] = {
            # before the response starts only: a dead, dying or frozen server costs a
            # retry, never a client error. One retry more than the EPP's list is long:
            # when every listed host failed, the last try goes to any healthy host of
            # the cluster (override_host's fallback policy), outside the EPP's accounting
            "retry_on": "connect-failure,reset,refused-stream",
            "num_retries": retries,
            "per_try_idle_timeout": _seconds(idle),
        }
        if retry_404:
            policy["retry_on"] += ",retriable-status-codes"
            policy["retriable_status_codes"] = [404]
        action["retry_policy"] = policy
        routes.append(
            {
                "match": match,
                "route": action,
                "request_headers_to_remove": [STREAM_HEADER, RETRY_404_HEADER],
            }
        )
    return routes


def _fallback_route(opts: EnvoyOptions) -> dict[str, Any]:
    """Fail-open: a request the EPP did not route carries no destination header (the EPP
    always sets it, and clears the route cache so Envoy matches again), so this route,
    first in the list, takes exactly those: to the fallback servers, else to the
    model-server cluster without a pick."""
    if opts.cluster == "original-dst" and not opts.fallback_servers:
        raise ValueError("fail-open with the original-dst cluster needs fallback servers")
    if opts.processing != "buffered":
        # measured (Envoy 1.40): once part of a FULL_DUPLEX_STREAMED body went to the
        # processor, Envoy cannot go on without it and answers the error itself
        raise ValueError("fail-open needs processing 'buffered' (the request body BUFFERED)")
    action = {
        "cluster": FALLBACK_CLUSTER if opts.fallback_servers else MODEL_CLUSTER,
        "timeout": _seconds(opts.route_timeout_s),
        "idle_timeout": _seconds(opts.route_timeout_s),
        "retry_policy": {
            "retry_on": "connect-failure,reset,refused-stream",
            "num_retries": max(len(opts.fallback_servers), opts.destinations) - 1,
            "per_try_idle_timeout": _seconds(opts.first_byte_timeout_s),
        },
    }
    match = {
        "prefix": "/",
        "headers": [{"name": DESTINATION_HEADER, "present_match": True, "invert_match": True}],
    }
    return {"match": match, "route": action}


def _local_replies(opts: EnvoyOptions) -> dict[str, Any]:
    """Envoy's own error answers (the EPP unreachable, an upstream timeout, no healthy
    upstream) in the OpenAI error shape the EPP's answers have. Answers the EPP wrote
    (details ``epp_*``) are left alone."""

    def error(message: str, error_type: str) -> dict[str, Any]:
        body = {"message": message, "type": error_type, "code": "%RESPONSE_CODE_DETAILS%"}
        return {"json_format": {"error": body}}

    def details(expression: str) -> dict[str, Any]:
        return {
            "extension_filter": {
                "name": "envoy.access_loggers.extension_filters.cel",
                "typed_config": {"@type": _CEL_FILTER, "expression": expression},
            }
        }

    return {
        "mappers": [
            {
                "filter": details("response.code_details.startsWith('ext_proc_error')"),
                "status_code": opts.status_on_error,
                "body_format_override": error(
                    "the endpoint picker is unreachable or did not answer in time",
                    "service_unavailable",
                ),
            },
            {
                "filter": details("!response.code_details.startsWith('epp_')"),
                "body_format_override": error("%LOCAL_REPLY_BODY%", "upstream_error"),
            },
        ]
    }


def epp_config(opts: EnvoyOptions) -> dict[str, Any]:
    """Envoy routed by the EPP: the ext_proc filter, and a model-server cluster that
    either gets its endpoints from the EPP over EDS and follows the EPP's ordered list
    with retries (``eds``), or connects to the one ``ip:port`` in the destination header
    (``original-dst``)."""
    grpc_service: dict[str, Any] = {"envoy_grpc": {"cluster_name": "epp"}}
    if opts.cluster == "eds":
        # tells the EPP this config can use a fallback list (ORIGINAL_DST cannot)
        grpc_service["initial_metadata"] = [
            {"key": MAX_DESTINATIONS_METADATA, "value": str(opts.destinations)}
        ]
    ext_proc = {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _EXT_PROC,
            "grpc_service": grpc_service,
            "failure_mode_allow": opts.failure_mode_allow,
            # fail closed with a 503 (not Envoy's default 500); _local_replies gives it
            # a JSON body
            "status_on_error": {"code": opts.status_on_error},
            "message_timeout": _seconds(opts.message_timeout_s),
            # the most an EPP's override_message_timeout may ask for (flow control)
            "max_message_timeout": _seconds(opts.max_message_timeout_s),
            "processing_mode": _processing_mode(opts.processing),
            # which endpoint answered: tells the EPP when Envoy failed over
            "response_attributes": [UPSTREAM_ADDRESS],
            # Without this Envoy silently drops the envoy.lb metadata we send.
            "metadata_options": {"receiving_namespaces": {"untyped": [LB_NAMESPACE]}},
        },
    }
    model_servers = _eds_cluster(opts) if opts.cluster == "eds" else _original_dst_cluster(opts)
    model_servers["circuit_breakers"] = _RETRY_BREAKER
    epp = _static_cluster(
        "epp",
        [(opts.epp_host, opts.epp_port), *opts.more_epps],
        http2=True,
        connect_timeout_s=opts.connect_timeout_s,
    )
    if opts.more_epps:
        # a new stream that cannot reach its EPP (a replica or worker just died, not
        # yet out of the cluster) is opened again on another one, not answered 503
        grpc_service["retry_policy"] = {
            "retry_on": "connect-failure,refused-stream,reset,unavailable",
            "num_retries": len(opts.more_epps),
            "retry_back_off": {"base_interval": "0.005s", "max_interval": "0.05s"},
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {"@type": _PREVIOUS_HOSTS},
                }
            ],
        }
        epp["circuit_breakers"] = _RETRY_BREAKER  # a dead replica's streams, opened again
        epp["health_checks"] = [_epp_health_check()]
        # a worker that refuses connections is skipped at once, before its health checks fail
        epp["outlier_detection"] = {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "interval": "1s",
            "base_ejection_time": "1s",
            "max_ejection_percent": 50,
        }
    if opts.epp_tls:
        epp["transport_socket"] = _unverified_tls()
    clusters, routes = [model_servers, epp], _routes(opts)
    if opts.failure_mode_allow:
        routes.insert(0, _fallback_route(opts))
        if opts.fallback_servers:
            fallback = _static_cluster(
                FALLBACK_CLUSTER, list(opts.fallback_servers), False, opts.connect_timeout_s
            )
            fallback["circuit_breakers"] = _RETRY_BREAKER
            clusters.append(fallback)
    config = _bootstrap(opts, [ext_proc], clusters, routes)
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm["typed_config"]["local_reply_config"] = _local_replies(opts)
    config["layered_runtime"] = {
        "layers": [
            {"name": "static", "static_layer": {GRACEFUL_CLOSE: opts.graceful_close}},
            {"name": "admin", "admin_layer": {}},  # /runtime_modify still works
        ]
    }
    if opts.cluster == "eds":
        # xDS requires the proxy to name itself
        config = {"node": {"id": "envoy", "cluster": "inference"}, **config}
    return config


def _epp_health_check() -> dict[str, Any]:
    """With several EPP addresses: gRPC health checks take one that stops answering
    (a worker that died, one draining) out of the ext_proc cluster within about a second,
    so new streams go to the others (docs/workers.md)."""
    return {
        "timeout": _seconds(EPP_HEALTH_TIMEOUT_S),
        "interval": _seconds(EPP_HEALTH_INTERVAL_S),
        "no_traffic_interval": _seconds(EPP_HEALTH_INTERVAL_S),
        "unhealthy_threshold": 2,
        "healthy_threshold": 1,
        "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
    }


def _unverified_tls() -> dict[str, Any]:
    """An upstream TLS socket that encrypts but trusts any certificate (no validation
    context), offering only HTTP/2 by ALPN."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _UPSTREAM_TLS,
            "common_tls_context": {"alpn_protocols": ["h2"]},
        },
    }


def _original_dst_cluster(opts: EnvoyOptions) -> dict[str, Any]:
    """The model servers as whatever single ``ip:port`` the destination header names."""
    return {
        "name": MODEL_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": _seconds(opts.connect_timeout_s),
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "original_dst_lb_config": {
            "use_http_header": True,
            "http_header_name": DESTINATION_HEADER,
        },
    }


def _eds_cluster(opts: EnvoyOptions) -> dict[str, Any]:
    """The model servers as the EPP serves them over EDS, picked by the EPP's list."""
    return {
        "name": MODEL_CLUSTER,
        "type": "EDS",
        "connect_timeout": _seconds(opts.connect_timeout_s),
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "eds_cluster_config": {
            "service_name": MODEL_CLUSTER,
            "eds_config": {
                "resource_api_version": "V3",
                "api_config_source": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "grpc_services": [
                        {
                            "envoy_grpc": {
                                "cluster_name": "epp",
                                # Envoy's default for xDS streams (0.5 s doubling to
                                # 30 s, jittered) left it on a restarted EPP's old
                                # endpoints for up to half a minute
                                "retry_policy": {
                                    "retry_back_off": {
                                        "base_interval": _seconds(opts.eds_retry_base_s),
                                        "max_interval": _seconds(opts.eds_retry_max_s),
                                    }
                                },
                            }
                        }
                    ],
                },
            },
        },
        "load_balancing_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.override_host",
                        "typed_config": {
                            "@type": _OVERRIDE_HOST,
                            "override_host_sources": [
                                {"header": DESTINATION_HEADER},
                                {
                                    "metadata": {
                                        "key": LB_NAMESPACE,
                                        "path": [{"key": DESTINATION_HEADER}],
                                    }
                                },
                            ],
                            # used only when none of the listed endpoints is usable
                            "fallback_policy": {
                                "policies": [
                                    {
                                        "typed_extension_config": {
                                            "name": "envoy.load_balancing_policies.least_request",
                                            "typed_config": {"@type": _LEAST_REQUEST},
                                        }
                                    }
                                ]
                            },
                        },
                    }
                }
            ]
        },
        # Envoy's own view, a second line behind the EPP's ejection: hosts that refuse
        # connections are skipped by the fallback policy at once.
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 2,
            "consecutive_5xx": 5,
            "interval": "1s",
            "base_ejection_time": "2s",
            "max_ejection_percent": 100,
        },
    }


def baseline_config(opts: EnvoyOptions, servers: list[tuple[str, int]]) -> dict[str, Any]:
    """Envoy alone: a static round-robin cluster over ``servers``, no EPP (for benchmarks)."""
    cluster = _static_cluster("model_servers", servers, False, opts.connect_timeout_s)
    return _bootstrap(opts, [], [cluster])


def client_routed_config(opts: EnvoyOptions) -> dict[str, Any]:
    """Envoy alone, no EPP: each request goes to the one ``ip:port`` its client put in
    ``x-gateway-destination-endpoint`` (ORIGINAL_DST; for benchmarks whose load generator
    plays an oracle router)."""
    return _bootstrap(opts, [], [_original_dst_cluster(opts)])


# The configs committed under envoy/ (regenerate: python -m epp_harness.envoyconfig envoy/).
EXAMPLES: dict[str, EnvoyOptions] = {
    "local.yaml": EnvoyOptions(),
    "local-lean.yaml": EnvoyOptions(processing="lean"),
    "local-buffered.yaml": EnvoyOptions(processing="buffered"),
    "local-original-dst.yaml": EnvoyOptions(cluster="original-dst"),
    "local-tls.yaml": EnvoyOptions(epp_tls=True),
    # epp serve --workers 2 on the default ports (docs/workers.md)
    "local-2-workers.yaml": EnvoyOptions(more_epps=(("127.0.0.1", 9100),)),
    "local-fail-open.yaml": EnvoyOptions(processing="buffered", failure_mode_allow=True),
    "compose.yaml": EnvoyOptions(listen_host="0.0.0.0", admin_host="0.0.0.0", epp_host="epp"),
}
EXAMPLE_HEADER = (
    "# Generated by `python -m epp_harness.envoyconfig envoy/`"
    " from epp_harness/envoyconfig.py; do not edit.\n"
)


def render_example(name: str) -> str:
    import yaml

    return EXAMPLE_HEADER + yaml.safe_dump(epp_config(EXAMPLES[name]), sort_keys=False)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "envoy")
    for example in EXAMPLES:
        (out / example).write_text(render_example(example))
        print(f"wrote {out / example}")
