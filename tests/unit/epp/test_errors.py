"""The exception tree: every exception the EPP defines sits under EppError, on the
client-visible branch or the internal one, and the client-visible bodies keep their
wire shape."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import orjson
import pytest

import epp
from epp.errors import (
    BadRequestError,
    BodyTooLargeError,
    ClientVisibleError,
    EppError,
    InternalError,
    ModelNotFoundError,
    NoEndpointError,
    PrefillRejectedError,
    QueueFullError,
    QueueTimeoutError,
    ShedError,
    ShuttingDownError,
)
from epp.extproc.messages import immediate

# both gRPC transports register grpc.health.v1, so one process imports only one of
# them (neither defines an exception)
SKIPPED = ("epp.__main__", "epp.extproc.grpclib_transport")


def _product_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(epp.__path__, "epp."):
        if info.name in SKIPPED:
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name:
                found.append(cls)
    return found


def test_every_product_exception_is_in_the_tree() -> None:
    classes = _product_exceptions()
    assert len(classes) >= 15  # the walk found the modules
    for cls in classes:
        assert (
            cls is EppError
            or cls is ClientVisibleError
            or cls is InternalError
            or (issubclass(cls, ClientVisibleError) != issubclass(cls, InternalError))
        ), f"{cls.__module__}.{cls.__qualname__} is on neither branch of epp.errors"


def test_every_tree_class_is_drawn_in_the_docstring() -> None:
    assert epp.errors.__doc__ is not None
    for cls in _product_exceptions():
        assert f" {cls.__name__} " in epp.errors.__doc__, cls.__name__


@pytest.mark.parametrize(
    ("error", "status", "body"),
    [
        (
            BadRequestError("prompt is required", "missing_prompt"),
            400,
            b'{"error":{"message":"prompt is required","type":"invalid_request_error",'
            b'"code":"missing_prompt"}}',
        ),
        (
            BodyTooLargeError("too big"),
            413,
            b'{"error":{"message":"too big","type":"invalid_request_error","code":null}}',
        ),
        (
            ShedError("shed"),
            429,
            b'{"error":{"message":"shed","type":"rate_limit_exceeded","code":null}}',
        ),
        (
            NoEndpointError("none"),
            503,
            b'{"error":{"message":"none","type":"service_unavailable","code":null}}',
        ),
        (
            ClientVisibleError("internal error in the endpoint picker"),
            500,
            b'{"error":{"message":"internal error in the endpoint picker",'
            b'"type":"internal_error","code":null}}',
        ),
    ],
)
def test_client_visible_errors_keep_their_status_and_body(
    error: ClientVisibleError, status: int, body: bytes
) -> None:
    assert (error.status, error.body()) == (status, body)


def test_a_prefill_rejection_relays_an_openai_body_and_wraps_any_other() -> None:
    upstream = b'{"error":{"message":"no such model"}}'
    assert PrefillRejectedError(404, upstream, "rejected").body() == upstream
    wrapped = PrefillRejectedError(422, b"<html>", "the prefill server rejected it")
    assert wrapped.status == 422
    assert orjson.loads(wrapped.body()) == {
        "error": {
            "message": "the prefill server rejected it",
            "type": "invalid_request_error",
            "code": "prefill_rejected",
        }
    }


@pytest.mark.parametrize(
    ("error", "status", "reason"),
    [
        (ShedError("x"), 429, "rejected-saturated"),
        (QueueFullError("x"), 429, "rejected-saturated"),
        (NoEndpointError("x"), 503, "rejected-no-endpoints"),
        (QueueTimeoutError("x", pool_empty=False), 429, "rejected-ttl-expired"),
        (QueueTimeoutError("x", pool_empty=True), 503, "rejected-ttl-expired"),
        (ShuttingDownError("x"), 503, "rejected-shutting-down"),
        # not drops: the request itself is wrong, or the EPP failed
        (BadRequestError("x"), 400, None),
        (BodyTooLargeError("x"), 413, None),
        (ModelNotFoundError("x"), 404, None),
        (PrefillRejectedError(422, b"{}", "x"), 422, None),
        (ClientVisibleError("x"), 500, None),
    ],
)
def test_a_dropped_request_says_why_as_the_llm_d_router_does(
    error: ClientVisibleError, status: int, reason: str | None
) -> None:
    reply = immediate(error).immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in reply.headers.set_headers}
    assert reply.status.code == status
    assert headers.get("x-llm-d-request-dropped-reason") == reason
    assert headers["content-type"] == "application/json"
