"""Envoy bootstrap configs, built as plain data (pure).

One builder serves ``epp stack``, the committed files under ``envoy/``, the tests and the
benchmarks, so the configs cannot drift apart. ``processing`` picks how much of each
request Envoy shows the EPP:

* ``full``: request headers + FULL_DUPLEX_STREAMED body (trailers SEND, as Envoy
  requires), response headers + STREAMED body. The EPP sees status, usage, end of stream.
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

import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from epp.extproc.messages import DESTINATION_HEADER, LB_NAMESPACE

Processing = Literal["full", "lean", "buffered"]
PROCESSING_MODES: tuple[Processing, ...] = ("full", "lean", "buffered")

_HCM = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

BUFFER_LIMIT_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class EnvoyOptions:
    listen_host: str = "127.0.0.1"
    listen_port: int = 8081
    admin_host: str = "127.0.0.1"
    admin_port: int = 9901
    epp_host: str = "127.0.0.1"
    epp_port: int = 9002
    processing: Processing = "full"
    # How long Envoy waits for each EPP reply; the EPP holds the header reply until the
    # whole body is in, so this bounds body upload time + scheduling.
    message_timeout_s: float = 30.0
    # Fail closed: with ORIGINAL_DST there is no destination without the EPP.
    failure_mode_allow: bool = False
    route_timeout_s: float = 600.0


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _static_cluster(name: str, endpoints: list[tuple[str, int]], http2: bool) -> dict[str, Any]:
    literal = all(_is_ip(h) for h, _ in endpoints)
    cluster: dict[str, Any] = {
        "name": name,
        # Service names (docker-compose, Kubernetes) need DNS; IP literals do not.
        "type": "STATIC" if literal else "STRICT_DNS",
        "connect_timeout": "1s",
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


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _processing_mode(processing: Processing) -> dict[str, str]:
    mode = {
        "request_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_header_mode": "SEND",
        "response_body_mode": "STREAMED",
        "response_trailer_mode": "SKIP",
    }
    if processing in ("lean", "buffered"):
        mode["response_body_mode"] = "NONE"
        mode["response_trailer_mode"] = "SEND"  # keeps the stream open; see module doc
    if processing == "buffered":
        mode["request_body_mode"] = "BUFFERED"
        mode["request_trailer_mode"] = "SKIP"
    return mode


def _bootstrap(
    opts: EnvoyOptions, http_filters: list[dict[str, Any]], clusters: list[dict[str, Any]]
) -> dict[str, Any]:
    hcm = {
        "@type": _HCM,
        "stat_prefix": "inference",
        "route_config": {
            "name": "inference",
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {
                                "cluster": "model_servers",
                                "timeout": f"{opts.route_timeout_s:g}s",
                            },
                        }
                    ],
                }
            ],
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


def epp_config(opts: EnvoyOptions) -> dict[str, Any]:
    """Envoy routed by the EPP: ext_proc filter + ORIGINAL_DST cluster reading the
    destination header (one ``ip:port``)."""
    ext_proc = {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _EXT_PROC,
            "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}},
            "failure_mode_allow": opts.failure_mode_allow,
            "message_timeout": f"{opts.message_timeout_s:g}s",
            "processing_mode": _processing_mode(opts.processing),
            # Without this Envoy silently drops the envoy.lb metadata we send.
            "metadata_options": {"receiving_namespaces": {"untyped": [LB_NAMESPACE]}},
        },
    }
    model_servers = {
        "name": "model_servers",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "per_connection_buffer_limit_bytes": BUFFER_LIMIT_BYTES,
        "original_dst_lb_config": {
            "use_http_header": True,
            "http_header_name": DESTINATION_HEADER,
        },
    }
    epp = _static_cluster("epp", [(opts.epp_host, opts.epp_port)], http2=True)
    return _bootstrap(opts, [ext_proc], [model_servers, epp])


def baseline_config(opts: EnvoyOptions, servers: list[tuple[str, int]]) -> dict[str, Any]:
    """Envoy alone: a static round-robin cluster over ``servers``, no EPP (for benchmarks)."""
    return _bootstrap(opts, [], [_static_cluster("model_servers", servers, http2=False)])


# The configs committed under envoy/ (regenerate: python -m epp.envoyconfig envoy/).
EXAMPLES: dict[str, EnvoyOptions] = {
    "local.yaml": EnvoyOptions(),
    "local-lean.yaml": EnvoyOptions(processing="lean"),
    "local-buffered.yaml": EnvoyOptions(processing="buffered"),
    "compose.yaml": EnvoyOptions(listen_host="0.0.0.0", admin_host="0.0.0.0", epp_host="epp"),
}
EXAMPLE_HEADER = (
    "# Generated by `python -m epp.envoyconfig envoy/` from epp/envoyconfig.py; do not edit.\n"
)


def render_example(name: str) -> str:
    import yaml

    return EXAMPLE_HEADER + yaml.safe_dump(epp_config(EXAMPLES[name]), sort_keys=False)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "envoy")
    for example in EXAMPLES:
        (out / example).write_text(render_example(example))
        print(f"wrote {out / example}")
