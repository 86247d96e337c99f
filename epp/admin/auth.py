"""API-key check for the admin API's mutating calls.

The key comes from ``ADMIN_API_KEY`` or ``--admin-api-key-file``; requests carry it in
``X-Api-Key``, compared in constant time. Missing header: 401; wrong key: 403. With no
key configured every mutating call is refused (403) with a message saying how to enable
them: the admin API is never open by default.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from aiohttp import web

from epp.common.replies import error

API_KEY_HEADER = "X-Api-Key"
API_KEY_ENV = "ADMIN_API_KEY"


class ApiKeyAuth:
    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else None

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def refusal(self, request: web.Request) -> web.Response | None:
        """None if the request may mutate, else the error response to send."""
        if self._key is None:
            return error(
                403,
                "admin_api_disabled",
                f"the admin API is disabled: start epp serve with {API_KEY_ENV} set in the "
                "environment or --admin-api-key-file FILE, and send that key in "
                f"{API_KEY_HEADER}",
            )
        given = request.headers.get(API_KEY_HEADER)
        if given is None:
            return error(401, "missing_api_key", f"missing {API_KEY_HEADER} header")
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._key):
            return error(403, "invalid_api_key", f"wrong {API_KEY_HEADER}")
        return None


def load_key(key_file: Path | None, environ: dict[str, str] | None = None) -> str | None:
    """The configured key: the file (stripped) wins over the environment. Raises
    OSError/ValueError naming the file if it is unreadable or empty."""
    if key_file is not None:
        key = key_file.read_text().strip()
        if not key:
            raise ValueError(f"admin API key file {key_file} is empty")
        return key
    env = os.environ if environ is None else environ
    return env.get(API_KEY_ENV) or None
