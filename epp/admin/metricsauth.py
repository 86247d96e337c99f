"""``--metrics-endpoint-auth``: ``/metrics`` only for Kubernetes identities allowed to
read it, as the llm-d Router chart expects (its ServiceMonitor sends the scraper's
service-account token).

A request's ``Authorization: Bearer TOKEN`` is checked with a TokenReview (who is it?)
and a SubjectAccessReview (may they ``get`` the non-resource URL ``/metrics``?). Answers
are cached per token for ``ttl_s`` so a scrape every few seconds costs the API server
two calls per interval, not per scrape. Missing or unknown token: 401; a known identity
without the permission: 403; the API server unreachable: 503 (all JSON errors)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from aiohttp import web

from epp.common.replies import error

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
DEFAULT_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class Decision:
    authenticated: bool
    allowed: bool
    reason: str = ""


class Reviewer(Protocol):
    async def review(self, token: str) -> Decision:
        """Who the token is and whether they may read /metrics; OSError when the API
        server cannot answer."""
        ...


class MetricsAuth:
    def __init__(
        self,
        reviewer: Reviewer,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviewer = reviewer
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[bytes, tuple[float, Decision]] = {}  # sha256(token) -> answer

    async def refusal(self, request: web.Request) -> web.Response | None:
        """None if the request may read /metrics, else the error to send."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error(401, "missing_bearer_token", "/metrics needs Authorization: Bearer")
        decision = await self._decision(token.strip())
        if decision is None:
            return error(503, "auth_unavailable", "cannot reach the Kubernetes API to check it")
        if not decision.authenticated:
            return error(401, "invalid_token", f"token not accepted: {decision.reason}")
        if not decision.allowed:
            return error(403, "forbidden", "this identity may not get /metrics")
        return None

    async def _decision(self, token: str) -> Decision | None:
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            decision = await self._reviewer.review(token)
        except OSError as exc:
            log.warning("/metrics auth: %s", exc)
            return None
        self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
        self._cache[key] = (now + self._ttl_s, decision)
        return decision


class KubeReviewer:
    """Reviews through the Kubernetes API (the client made on first use, from
    ``kubeconfig`` or the pod's service account)."""

    def __init__(self, kubeconfig: Path | None) -> None:
        self._kubeconfig = kubeconfig
        self._api: ApiClient | None = None

    async def review(self, token: str) -> Decision:
        from kubernetes_asyncio import client as k8s
        from kubernetes_asyncio.client.exceptions import ApiException

        from epp.discovery.kubernetes import api_client

        if self._api is None:
            self._api = await api_client(self._kubeconfig)
        try:
            review = await k8s.AuthenticationV1Api(self._api).create_token_review(
                k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(token=token))
            )
            status: Any = review.status
            if status is None or not status.authenticated:
                return Decision(False, False, (status and status.error) or "")
            user = status.user
            access = await k8s.AuthorizationV1Api(self._api).create_subject_access_review(
                k8s.V1SubjectAccessReview(
                    spec=k8s.V1SubjectAccessReviewSpec(
                        user=user.username,
                        groups=user.groups,
                        uid=user.uid,
                        extra=user.extra,
                        non_resource_attributes=k8s.V1NonResourceAttributes(
                            path=METRICS_PATH, verb="get"
                        ),
                    )
                )
            )
        except ApiException as exc:
            raise OSError(f"Kubernetes API: {exc.status} {exc.reason}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise OSError(f"Kubernetes API: {exc!r}") from None
        allowed: Any = access.status
        return Decision(True, bool(allowed and allowed.allowed), (allowed and allowed.reason) or "")

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
