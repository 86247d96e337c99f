"""Is a model server ready to take requests? ``GET /health`` answers 200, and, when a
model is expected, ``GET /v1/models`` lists it.

Used before an endpoint announced at runtime joins the pool, and before an ejected
endpoint is reinstated. Every failure is an answer (a reason string), never an
exception, so callers can log it and retry.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

HEALTH_PATH = "/health"
MODELS_PATH = "/v1/models"


class ReadinessProbe:
    def __init__(self, *, model: str | None = None, timeout_s: float = 2.0) -> None:
        self.model = model
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # asyncio.timeout below, not aiohttp's (see epp.datalayer.scraper)
                timeout=aiohttp.ClientTimeout(total=None),
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                trust_env=False,
            )
        return self._session

    async def stop(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def check(self, address: str) -> str | None:
        """None when ready, else why not (e.g. ``cannot connect: ...``)."""
        session = self._client()
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(f"http://{address}{HEALTH_PATH}") as resp:
                    if resp.status != 200:
                        return f"{HEALTH_PATH} answered HTTP {resp.status}"
                if self.model is None:
                    return None
                async with session.get(f"http://{address}{MODELS_PATH}") as resp:
                    if resp.status != 200:
                        return f"{MODELS_PATH} answered HTTP {resp.status}"
                    body = await resp.read()
        except TimeoutError:
            return f"no answer within {self.timeout_s:g}s"
        except (aiohttp.ClientError, OSError) as exc:
            return f"cannot connect: {exc}" if str(exc) else f"cannot connect: {type(exc).__name__}"
        return _model_missing(body, self.model)


def _model_missing(body: bytes, model: str) -> str | None:
    try:
        doc = orjson.loads(body)
        served = [m["id"] for m in doc["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"{MODELS_PATH} is not an OpenAI model list"
    if model in served:
        return None
    return f"serves {', '.join(map(str, served)) or 'no model'}, not {model!r}"
