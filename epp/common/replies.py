"""JSON answers of the admin HTTP API: errors in the same shape as the EPP's request
errors (``{"error": {"message", "type", "code"}}``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}


def error(status: int, code: str, message: str) -> web.Response:
    body = {"error": {"message": message, "type": _TYPES.get(status, "error"), "code": code}}
    return web.json_response(body, status=status)


def ok(doc: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(doc, status=status)
