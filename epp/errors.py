"""The EPP's exceptions: one tree, so ``except EppError`` catches every error the EPP
raises on purpose, and one branch of it is what a client may see.

::

    EppError                         anything the EPP raises on purpose
    ├── ClientVisibleError           answered to the client: HTTP status + OpenAI body
    │   │                            (default 500 internal_error)
    │   ├── BadRequestError          400 invalid_request_error   the request cannot be parsed
    │   │   └── BadInput             400 (admin/instances.py)    a bad /instances body
    │   ├── BodyTooLargeError        413 invalid_request_error
    │   ├── ModelNotFoundError       404 invalid_request_error   a model nobody serves
    │   ├── ShedError                429 rate_limit_exceeded     admission shed it
    │   │   └── QueueFullError       429 (queue_full)            flow control's limits
    │   ├── NoEndpointError          503 service_unavailable     no endpoint can serve it
    │   ├── QueueTimeoutError        429 or 503 (queue_timeout)  waited its time limit
    │   ├── ShuttingDownError        503 service_unavailable     the EPP is stopping
    │   ├── PrefillRejectedError     400-451 as the prefill server answered, with its body
    │   └── PlacementError           (lora/placement.py)         a server refused a LoRA
    │                                                            load or unload: its status
    └── InternalError                never shown to a client as it is: logged, counted
        ├── ConfigError              (common/params.py)          config file or parameters
        ├── ExtensionError           (common/extensions.py)      an installed plugin
        │                                                        package's entry point
        ├── TlsError                 (extproc/tls.py)            certificate or key files
        ├── ResolveError             (discovery/names.py)        a name with no address
        ├── PoolError                (discovery/pool_endpoints.py) an unusable InferencePool
        ├── EndpointsFileError       (discovery/endpoints_file.py) an unusable --endpoints-file
        ├── ObjectiveError           (discovery/objectives.py)   an unreadable InferenceObjective
        ├── ScrapeError              (datalayer/scraper.py)      /metrics gave no metrics
        ├── MetricsParseError        (datalayer/prometheus.py)   a malformed /metrics page
        ├── OrcaParseError           (datalayer/orca.py)         a malformed ORCA report
        ├── KvEventDecodeError       (kvevents/wire.py)          an undecodable KV event
        ├── FrameError               (datalayer/peerload.py)     an unreadable peer-load frame
        ├── TokenizerError           (common/tokenization.py)    tokenizer files, a template
        ├── FetchError               (top/command.py)            `epp top` cannot read the EPP
        ├── StreamBroken             (extproc/driver.py)         Envoy broke the ext_proc
        │                                                        protocol once the response
        │                                                        had started
        ├── ConnectionFailure        (extproc/native/frames.py)  a peer broke HTTP/2 for the
        │                                                        whole connection: GOAWAY
        ├── StreamError              (extproc/native/frames.py)  ... for one stream: RST_STREAM
        ├── StreamGone               (extproc/native/streams.py) a reply for a stream already
        │                                                        reset or closed
        ├── GrpcError                (extproc/native/grpc.py)    ends a gRPC call with a status
        ├── LeaseError               (serving/leaderelection.py) a Lease call failed
        └── LegFailed                (disagg/legs.py)            prefill server unreachable
                                                                 or too slow

The classes in parentheses live beside the code that raises them (this module is the
bottom layer: it imports nothing from ``epp``). Those about bad input (config, TLS
files, entry points, names, pools, engine reports) are also ValueErrors (``class
ConfigError(InternalError, ValueError)``): parsing code that catches ``ValueError``
catches them too.

A refused request (shed, no endpoint, timed out in the queue, shutting down) is a
*drop* in the llm-d Router's terms: its class names llm-d's reason
(``dropped_reason``), sent as the ``x-llm-d-request-dropped-reason`` header.

The ext_proc stream maps a :class:`ClientVisibleError` to an ImmediateResponse in one
place (the admin API answers :class:`BadInput` in the same JSON shape); any other
exception reaching the stream becomes a plain 500 that names nothing inside. Foreign
exceptions (aiohttp, grpc, kubernetes) are converted where they enter.
"""

from __future__ import annotations

import orjson


class EppError(Exception):
    """The root: every exception the EPP defines derives from it."""


class ClientVisibleError(EppError):
    """An error the client should see, with an OpenAI-shaped JSON body."""

    status: int = 500  # per class; an error relayed from upstream sets its own
    error_type: str = "internal_error"
    # the llm-d Router's reason for dropping the request (DROPPED_REASON_HEADER); None:
    # not a drop (the request itself is wrong, or the EPP failed)
    dropped_reason: str | None = None

    def __init__(
        self, message: str, code: str | None = None, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s  # sent as Retry-After when set

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.error_type, "code": self.code}}
        )


class InternalError(EppError):
    """A failure inside the EPP or between it and its servers; the message says what and
    where, for the log. Never sent to a client as it is."""


class BadRequestError(ClientVisibleError):
    status = 400
    error_type = "invalid_request_error"


class BodyTooLargeError(ClientVisibleError):
    status = 413
    error_type = "invalid_request_error"


class ModelNotFoundError(ClientVisibleError):
    """The request names a model the gateway knows nobody serves (models.baseModels and
    models.adapters both set, the model in neither)."""

    status = 404
    error_type = "invalid_request_error"


# The response header that says why the EPP dropped a request, and its values (the
# llm-d Router's).
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
SATURATED = "rejected-saturated"
NO_ENDPOINTS = "rejected-no-endpoints"
TTL_EXPIRED = "rejected-ttl-expired"
SHUTTING_DOWN = "rejected-shutting-down"


class ShedError(ClientVisibleError):
    """No room for the request: the pool is saturated and it is sheddable, or flow
    control cannot hold it."""

    status = 429
    error_type = "rate_limit_exceeded"
    dropped_reason = SATURATED


class QueueFullError(ShedError):
    """Flow control cannot hold the request (its band or every band is full), or a
    request of a higher band displaced it."""


class NoEndpointError(ClientVisibleError):
    status = 503
    error_type = "service_unavailable"
    dropped_reason = NO_ENDPOINTS


class QueueTimeoutError(ClientVisibleError):
    """The request waited its time limit in flow control's queue: 429 while the pool
    has endpoints (all of them busy), 503 when it has none."""

    dropped_reason = TTL_EXPIRED

    def __init__(
        self,
        message: str,
        *,
        pool_empty: bool,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message, code, retry_after_s)
        like = NoEndpointError if pool_empty else ShedError
        self.status, self.error_type = like.status, like.error_type


class ShuttingDownError(ClientVisibleError):
    """The EPP is stopping: it takes no request (held ones are answered at once)."""

    status = 503
    error_type = "service_unavailable"
    dropped_reason = SHUTTING_DOWN


class PrefillRejectedError(ClientVisibleError):
    """The prefill server answered a client error (400-451): the client gets that status
    and, when it is OpenAI-shaped JSON, that body."""

    error_type = "invalid_request_error"

    def __init__(self, status: int, upstream_body: bytes, message: str) -> None:
        super().__init__(message, code="prefill_rejected")
        self.status = status
        self._upstream = upstream_body

    def body(self) -> bytes:
        try:
            doc = orjson.loads(self._upstream)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict) and "error" in doc:
            return self._upstream
        return super().body()
