"""The EPP's error hierarchy. Each error knows its HTTP status and OpenAI error type;
the Envoy adapter maps any of them to an ImmediateResponse in one place."""

from __future__ import annotations

from typing import ClassVar

import orjson


class EppError(Exception):
    """An error the client should see, with an OpenAI-shaped JSON body."""

    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"

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
