"""The EPP's error hierarchy. Each error knows its HTTP status and OpenAI error type;
the Envoy adapter maps any of them to an ImmediateResponse in one place."""

from __future__ import annotations

import orjson


class EppError(Exception):
    """An error the client should see, with an OpenAI-shaped JSON body."""

    status: int = 500  # per class; an error relayed from upstream sets its own
    error_type: str = "internal_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.error_type, "code": self.code}}
        )


class BadRequestError(EppError):
    status = 400
    error_type = "invalid_request_error"


class BodyTooLargeError(EppError):
    status = 413
    error_type = "invalid_request_error"


class ShedError(EppError):
    status = 429
    error_type = "rate_limit_exceeded"


class NoEndpointError(EppError):
    status = 503
    error_type = "service_unavailable"


class PrefillRejectedError(EppError):
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
