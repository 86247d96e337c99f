"""What the EPP tells its operators: its Prometheus metrics (and the llm-d Router's
metric names beside them), request tracing (OpenTelemetry behind ``--tracing``) and log
set-up."""
