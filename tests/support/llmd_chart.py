"""What the llm-d Router chart gives its endpoint picker, transcribed from
llm-d/llm-d-router (commit ebab687): the container's `args:` from
`config/charts/routerlib/templates/_deployment.yaml` and the default config from
`_config.yaml`, rendered with the chart's default values, release `qwen` in namespace
`default`."""

from __future__ import annotations

from pathlib import Path

# the chart's default-plugins.yaml (values: modelServers.type vllm, protocol http)
DEFAULT_PLUGINS = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: "http"
    path: "/metrics"
    insecureSkipVerify: true
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


def chart_args(config_file: Path, *, selector: str | None = None, ports: str = "") -> list[str]:
    """The epp container's `args:` as the chart renders them: pool mode (the default,
    inferencePool.create true), or standalone mode with modelServers.matchLabels
    (``selector``) and modelServers.targetPorts (``ports``)."""
    if selector is None:
        mode = ["--pool-name", "qwen", "--pool-namespace", "default",
                "--pool-group", "inference.networking.k8s.io"]  # fmt: skip
    else:
        mode = ["--endpoint-selector", selector, "--endpoint-target-ports", ports]
    return [
        *mode,
        "--zap-encoder", "json",
        "--config-file", str(config_file),
        "--grpc-health-port", "9003",
        "--tracing=false",
    ]  # fmt: skip
