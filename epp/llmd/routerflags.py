"""The llm-d Router's ``epp serve`` flags that have no counterpart of ours, so that the
argument list its chart renders starts this EPP unchanged (docs/llm-d-router.md):
``--metrics-endpoint-auth`` (:mod:`epp.admin.metricsauth`), ``--tracing``
(:mod:`epp.observability.otel`) and ``--ha-enable-leader-election``
(:mod:`epp.serving.leaderelection`).

The rest of its flags live beside the ones of ours they map onto: ``--pool-group``,
``--endpoint-selector``, ``--endpoint-target-ports`` (:mod:`epp.discovery.serve_pool`),
``--secure-serving``, ``--cert-path`` (:mod:`epp.extproc.tlsflags`), ``-v``,
``--zap-encoder`` (:mod:`epp.observability.logsetup`), ``--config-file``, ``--config-text``,
``--metrics-port``, ``--grpc-health-port`` (:mod:`epp.serving.serve`)."""

from __future__ import annotations

import argparse

from epp.common.argtypes import go_bool
from epp.observability.logsetup import add_router_logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "llm-d Router compatibility", "their flags, accepted (see docs/llm-d-router.md)"
    )
    add_router_logging(g)
    g.add_argument(
        "--metrics-endpoint-auth",
        type=go_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="/metrics only for Kubernetes identities allowed to get it (a bearer token, "
        "checked with TokenReview and SubjectAccessReview; --kubeconfig or the pod's "
        "service account). Off by default here, unlike theirs (docs/llm-d-router.md)",
    )
    g.add_argument(
        "--tracing",
        type=go_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="OpenTelemetry traces of every request, exported over OTLP/HTTP as the "
        "standard OTEL_* variables say (docs/tracing.md); traceparent goes on to the "
        "model servers",
    )
    g.add_argument(
        "--ha-enable-leader-election",
        type=go_bool,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="active-passive replicas: they contend for a Lease and only the leader reports "
        "ready (a standby takes over within the lease duration); needs --pool-name or "
        "--endpoint-selector. Off: every replica is ready (active-active, docs/replicas.md)",
    )
