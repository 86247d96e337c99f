"""A loopback fake of the Kubernetes API server for pods, InferencePools and
InferenceObjectives.

It speaks the real list/watch HTTP protocol, so the real ``kubernetes-asyncio`` client
drives it unchanged:

* ``GET .../pods``, ``.../inferencepools`` and ``.../inferenceobjectives``: a JSON list whose
  ``metadata.resourceVersion`` is the store's current version;
* ``?watch=true``: a chunked stream of ``{"type", "object"}`` lines (ADDED, MODIFIED,
  DELETED, BOOKMARK, ERROR) replayed from ``resourceVersion`` and then live, closed after
  ``timeoutSeconds``; a version older than the compaction point gets an ERROR event
  carrying a ``Status`` with code 410, as a real server answers an expired watch;
* ``labelSelector`` (``k=v``, ``k==v``, ``k!=v``) and ``fieldSelector``
  (``metadata.name``, ``metadata.namespace``); an object that stops (starts) matching a
  watch's selector is sent as DELETED (ADDED), like the API server's watch cache does;
* ``POST .../events`` is stored, so tests can read what the client reported;
* ``coordination.k8s.io/v1`` Leases: read, create (409 if it exists) and replace (409
  unless the body names the stored ``resourceVersion``), as leader election uses them.

Every mutation bumps one global resourceVersion, like etcd's revision. Tests change
state with :meth:`FakeKube.apply` / :meth:`delete` and break things with
:meth:`compact`, :meth:`drop_watches` and :meth:`fail_next`. All methods run on the
server's event loop; tests/support/kube_server.py serves it, also from a thread for
tests that drive other processes.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.kube_selectors import SelectorError, matcher, parse_bool

Obj = dict[str, Any]
KINDS = {
    "pods": ("v1", "Pod"),
    "inferencepools": ("inference.networking.k8s.io/v1", "InferencePool"),
    "inferenceobjectives": ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"),
    "leases": ("coordination.k8s.io/v1", "Lease"),
}
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
_DROP = object()  # queued to a watcher: cut its connection without a clean end
_END = object()  # queued to a watcher: end its stream cleanly, as a timeout would


@dataclass
class _Change:
    rv: int
    resource: str
    namespace: str
    old: Obj | None
    new: Obj | None


@dataclass(eq=False)
class _Watch:
    resource: str
    namespace: str
    matches: Callable[[Obj], bool]
    bookmarks: bool
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


@dataclass(frozen=True)
class Seen:
    """One request the server answered, for assertions on how the client behaved."""

    method: str
    resource: str
    query: dict[str, str]

    @property
    def watch(self) -> bool:
        return parse_bool(self.query.get("watch", ""))


class FakeKube:
    def __init__(self) -> None:
        self.rv = 1
        self.compacted_rv = 0  # watches from versions below this get 410 Gone
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.history: list[_Change] = []
        self.requests: list[Seen] = []
        self.events: list[Obj] = []  # core/v1 Events the client created
        # TokenReview / SubjectAccessReview: bearer token -> user name, and the users
        # allowed to GET the non-resource URL /metrics
        self.tokens: dict[str, str] = {}
        self.metrics_readers: set[str] = set()
        self._watches: set[_Watch] = set()
        self._failures: list[int] = []
        self._stalls = 0
        self.end_watches_at_once = False  # every watch stream ends right after its replay
        self._stalled = asyncio.Event()  # never set: stalled requests wait for the client

    # -- test controls -----------------------------------------------------------------
    def apply(self, resource: str, obj: Obj) -> Obj:
        """Create or replace ``obj`` (a pod or pool dict); returns the stored copy."""
        new = copy.deepcopy(obj)
        meta = new["metadata"]
        key = (resource, meta["namespace"], meta["name"])
        old = self.objects.get(key)
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", f"uid-{meta['name']}")
        self.objects[key] = new
        self._publish(_Change(self.rv, resource, meta["namespace"], old, new))
        return new

    def delete(self, resource: str, namespace: str, name: str) -> None:
        old = self.objects.pop((resource, namespace, name))
        self.rv += 1
        self._publish(_Change(self.rv, resource, namespace, old, None))

    def compact(self) -> None:
        """Forget history up to now: watches resuming from an older version get 410."""
        self.compacted_rv = self.rv
        self.history.clear()

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current version to every watch that asked for them."""
        for w in self._watches:
            if w.bookmarks:
                api_version, kind = KINDS[w.resource]
                meta = {"resourceVersion": str(self.rv)}
                obj = {"apiVersion": api_version, "kind": kind, "metadata": meta}
                w.queue.put_nowait({"type": "BOOKMARK", "object": obj})

    def drop_watches(self) -> int:
        """Cut every open watch connection mid-stream; returns how many there were."""
        for w in self._watches:
            w.queue.put_nowait(_DROP)
        return len(self._watches)

    def fail_next(self, *statuses: int) -> None:
        """Answer the next GETs (list or watch) with these HTTP statuses, in order."""
        self._failures.extend(statuses)

    def stall_next(self, count: int = 1) -> None:
        """Accept the next ``count`` GETs and never answer them (a hung API server)."""
        self._stalls += count

    def open_watches(self, resource: str) -> int:
        return sum(1 for w in self._watches if w.resource == resource)

    def seen(self, resource: str) -> list[Seen]:
        return [r for r in self.requests if r.resource == resource]

    # -- HTTP --------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._get("pods"))
        group = "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools"
        app.router.add_get(group, self._get("inferencepools"))
        objectives = (
            "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{ns}/inferenceobjectives"
        )
        app.router.add_get(objectives, self._get("inferenceobjectives"))
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._post_event)
        app.router.add_get(LEASES + "/{name}", self._read_lease)
        app.router.add_post(LEASES, self._create_lease)
        app.router.add_put(LEASES + "/{name}", self._replace_lease)
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        app.router.add_post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews", self._access_review
        )
        return app

    async def _token_review(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen("POST", "tokenreviews", {}))
        user = self.tokens.get(body["spec"]["token"])
        status: Obj = {"authenticated": False, "error": "invalid bearer token"}
        if user is not None:
            groups = ["system:authenticated"]
            status = {"authenticated": True, "user": {"username": user, "groups": groups}}
        return web.json_response({**body, "status": status}, status=201)

    async def _access_review(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen("POST", "subjectaccessreviews", {}))
        spec = body["spec"]
        attrs = spec.get("nonResourceAttributes") or {}
        allowed = (
            spec.get("user") in self.metrics_readers
            and attrs.get("path") == "/metrics"
            and attrs.get("verb") == "get"
        )
        return web.json_response({**body, "status": {"allowed": allowed}}, status=201)

    def _get(self, resource: str) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.StreamResponse:
            seen = Seen("GET", resource, dict(request.query))
            self.requests.append(seen)
            if self._stalls:
                self._stalls -= 1
                await self._stalled.wait()
            if self._failures:
                code = self._failures.pop(0)
                return _status(code, "InternalError", f"injected failure {code}")
            try:
                matches = matcher(request.query)
            except SelectorError as exc:
                return _status(400, "BadRequest", str(exc))
            ns = request.match_info["ns"]
            if seen.watch:
                return await self._watch(request, resource, ns, matches)
            api_version, kind = KINDS[resource]
            items = [
                o for (r, n, _), o in sorted(self.objects.items()) if r == resource and n == ns
            ]
            return web.json_response(
                {
                    "apiVersion": api_version,
                    "kind": f"{kind}List",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": [o for o in items if matches(o)],
                }
            )

        return handler

    async def _watch(
        self, request: web.Request, resource: str, ns: str, matches: Callable[[Obj], bool]
    ) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        w = _Watch(resource, ns, matches, parse_bool(request.query.get("allowWatchBookmarks", "")))
        # Decide the replay and register for live changes in one step (no await between),
        # so no change falls in a gap.
        if since in ("", "0"):
            replay: list[Obj] = [
                {"type": "ADDED", "object": o}
                for (r, n, _), o in sorted(self.objects.items())
                if r == resource and n == ns and matches(o)
            ]
        elif int(since) < self.compacted_rv:
            replay = [_expired(since, self.compacted_rv)]
        else:
            replay = [e for c in self.history if c.rv > int(since) for e in _events(w, c)]
        self._watches.add(w)
        if self.end_watches_at_once:
            w.queue.put_nowait(_END)
        response = web.StreamResponse(headers={"content-type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        timeout = float(request.query.get("timeoutSeconds", "3600"))
        try:
            for event in replay:
                await response.write(json.dumps(event).encode() + b"\n")
            if replay and replay[0]["type"] == "ERROR":
                return response
            async with asyncio.timeout(timeout):
                while True:
                    event = await w.queue.get()
                    if event is _DROP:
                        if request.transport is not None:  # None: the client left already
                            request.transport.abort()
                        return response
                    if event is _END:
                        break
                    await response.write(json.dumps(event).encode() + b"\n")
        except TimeoutError:
            pass  # the server-side timeout ends the stream cleanly, as the real one does
        finally:
            self._watches.discard(w)
        await response.write_eof()
        return response

    def lease(self, namespace: str, name: str) -> Obj | None:
        return self.objects.get(("leases", namespace, name))

    async def _read_lease(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        self.requests.append(Seen("GET", "leases", dict(request.query)))
        if self._failures:
            code = self._failures.pop(0)
            return _status(code, "InternalError", f"injected failure {code}")
        lease = self.lease(ns, name)
        if lease is None:
            return _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        return web.json_response(lease)

    async def _create_lease(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen("POST", "leases", dict(request.query)))
        ns, name = request.match_info["ns"], body["metadata"]["name"]
        if self.lease(ns, name) is not None:
            return _status(409, "AlreadyExists", f'leases "{name}" already exists')
        body["metadata"]["namespace"] = ns
        return web.json_response(self.apply("leases", body), status=201)

    async def _replace_lease(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen("PUT", "leases", dict(request.query)))
        ns, name = request.match_info["ns"], request.match_info["name"]
        stored = self.lease(ns, name)
        if stored is None:
            return _status(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        version = body.get("metadata", {}).get("resourceVersion")
        if version != stored["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", f'the object has been modified: "{name}"')
        body["metadata"]["namespace"] = ns
        return web.json_response(self.apply("leases", body))

    async def _post_event(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen("POST", "events", dict(request.query)))
        self.rv += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.events.append(body)
        return web.json_response(body, status=201)

    def _publish(self, change: _Change) -> None:
        self.history.append(change)
        for w in self._watches:
            for event in _events(w, change):
                w.queue.put_nowait(event)


def _events(w: _Watch, c: _Change) -> list[Obj]:
    """What one change looks like to one watch, given its selector."""
    if c.resource != w.resource or c.namespace != w.namespace:
        return []
    was = c.old is not None and w.matches(c.old)
    now = c.new is not None and w.matches(c.new)
    if c.new is None:
        if not was:
            return []
        assert c.old is not None
        gone = copy.deepcopy(c.old)
        gone["metadata"]["resourceVersion"] = str(c.rv)
        return [{"type": "DELETED", "object": gone}]
    if now:
        return [{"type": "MODIFIED" if was else "ADDED", "object": c.new}]
    return [{"type": "DELETED", "object": c.new}] if was else []


def _expired(since: str, oldest: int) -> Obj:
    message = f"too old resource version: {since} ({oldest})"
    return {"type": "ERROR", "object": _status_body(410, "Expired", message)}


def _status_body(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(_status_body(code, reason, message), status=code)
