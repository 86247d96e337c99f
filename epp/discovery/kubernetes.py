"""InferencePool discovery: keep the datastore equal to the ready pods of a pool, times their ports.

Two reflectors run side by side: one watches the ``InferencePool`` itself (by
``metadata.name`` field selector), one the pods its ``spec.selector`` matches; a third
follows the namespace's InferenceObjectives (their priorities:
:mod:`epp.discovery.objectives`). A changed
selector restarts the pod reflector; the old pod set stays in place until the new list
arrives, so a selector edit does not empty the pool for a moment. Which endpoints a pod
makes is decided by :mod:`epp.discovery.pool_endpoints`; this module only applies the
difference to the datastore, touching only the endpoints it added itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from epp.datastore import Datastore
from epp.discovery.membership_diff import apply, diff
from epp.discovery.objectives import ObjectiveWatch
from epp.discovery.pool_endpoints import (
    POOL_GROUP,
    POOL_PLURAL,
    POOL_VERSION,
    PodEndpoints,
    PoolError,
    PoolSpec,
    parse_pool,
    pod_endpoints,
    pod_name,
)
from epp.discovery.poolref import PoolRef, SelectorRef
from epp.discovery.reflector import Obj, Reflector, WatchTiming
from epp.flowcontrol.saturation import WatchedObjectives
from epp.types import Endpoint

log = logging.getLogger(__name__)

EVENT_REASON = "InvalidInferenceEndpoint"


async def api_client(kubeconfig: Path | None) -> k8s.ApiClient:
    """A client from ``kubeconfig``, else the pod's service account when in a cluster,
    else the usual kubeconfig ($KUBECONFIG, ~/.kube/config). Raises OSError saying why not."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            path = None if kubeconfig is None else str(kubeconfig)
            await k8s_config.load_kube_config(
                config_file=path, client_configuration=configuration, persist_config=False
            )
    except (k8s_config.ConfigException, OSError) as exc:
        where = kubeconfig or "in-cluster or default kubeconfig"
        raise OSError(f"Kubernetes client config ({where}): {exc}") from None
    return k8s.ApiClient(configuration)


class PoolDiscovery:
    def __init__(
        self,
        api: k8s.ApiClient,
        datastore: Datastore,
        pool_name: str,
        namespace: str,
        *,
        default_engine: str = "vllm",
        timing: WatchTiming | None = None,
        on_ready: Callable[[bool], Awaitable[None]] | None = None,
        objectives: WatchedObjectives | None = None,
    ) -> None:
        self._api = api
        self._core = k8s.CoreV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._datastore = datastore
        self.pool_name = pool_name
        self.namespace = namespace
        self._engine = default_engine
        self._timing = timing or WatchTiming()
        # told True once the pool and its pods are listed, False when the pool goes
        # (deleted or invalid), True again after the next pods list
        self._on_ready = on_ready
        self.ready = False
        self.synced = asyncio.Event()  # set once the pool and its pods were first listed
        self.pool: PoolSpec | None = None
        self._pods: dict[str, Obj] = {}
        self._by_pod: dict[str, PodEndpoints] = {}
        self._ours: dict[str, Endpoint] = {}  # address -> endpoint this discovery added
        self._pods_task: asyncio.Task[None] | None = None
        self._pool_task: asyncio.Task[None] | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()
        # the pool's InferenceObjectives' priorities go into ``objectives`` (None: unwatched)
        self._objectives = objectives
        self._objective_watch: ObjectiveWatch | None = None
        self._objectives_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Follow the pool: its object, then its pods; and its InferenceObjectives."""
        pools = Reflector(
            f"InferencePool {self.namespace}/{self.pool_name}",
            self._custom.list_namespaced_custom_object,
            {
                "group": POOL_GROUP,
                "version": POOL_VERSION,
                "namespace": self.namespace,
                "plural": POOL_PLURAL,
                "field_selector": f"metadata.name={self.pool_name}",
            },
            self._pools_listed,
            self._pool_event,
            self._timing,
        )
        self._pool_task = asyncio.create_task(pools.run(), name="inferencepool-watch")
        if self._objectives is not None:
            watch = ObjectiveWatch(
                self._custom.list_namespaced_custom_object,
                self.namespace,
                self.pool_name,
                self._objectives,
                self._timing,
            )
            self._objective_watch = watch
            self._objectives_task = asyncio.create_task(
                watch.reflector.run(), name="inferenceobjectives-watch"
            )

    def follow(self, spec: PoolSpec) -> None:
        """Follow the pods ``spec`` selects, with no InferencePool object (the llm-d
        Router's standalone mode)."""
        self.pool = spec
        self._start_pods(spec)

    async def stop(self) -> None:
        """Stop watching and close the client; the endpoints stay (the process is ending)."""
        tasks = [
            t
            for t in (self._pool_task, self._pods_task, self._objectives_task, *self._side_tasks)
            if t
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._api.close()

    # -- the pool ------------------------------------------------------------------------
    async def _pools_listed(self, items: list[Obj]) -> None:
        await self._set_pool(items[0] if items else None)

    async def _pool_event(self, kind: str, obj: Obj) -> None:
        await self._set_pool(None if kind == "DELETED" else obj)

    async def _set_pool(self, obj: Obj | None) -> None:
        spec: PoolSpec | None = None
        if obj is not None:
            try:
                spec = parse_pool(obj)
            except PoolError as exc:
                log.error("%s; treating the pool as absent until it is fixed", exc)
        if spec is None:
            if self.pool is not None or obj is None:
                log.warning(
                    "InferencePool %s/%s not found: no endpoints", self.namespace, self.pool_name
                )
            self.pool = None
            await self._cancel_pods()
            self._pods.clear()
            self._recompute_all()
            await self._set_ready(False)
            return
        old, self.pool = self.pool, spec
        if self._objective_watch is not None:  # poolSelector matches the pool's labels
            assert obj is not None
            self._objective_watch.pool_labels(obj["metadata"].get("labels") or {})
        if old is None or old.match_labels != spec.match_labels or self._pods_task is None:
            log.info(
                "InferencePool %s/%s: watching pods with labels %s, target ports %s",
                self.namespace,
                self.pool_name,
                spec.label_selector,
                list(spec.target_ports) or "none (port discovery only)",
            )
            await self._cancel_pods()
            self._start_pods(spec)
        if old != spec:
            self._recompute_all()

    # -- its pods ------------------------------------------------------------------------
    def _start_pods(self, spec: PoolSpec) -> None:
        pods = Reflector(
            f"pods {self.namespace} {spec.label_selector}",
            self._core.list_namespaced_pod,
            {"namespace": self.namespace, "label_selector": spec.label_selector},
            self._pods_listed,
            self._pod_event,
            self._timing,
        )
        self._pods_task = asyncio.create_task(pods.run(), name="pool-pods-watch")

    async def _cancel_pods(self) -> None:
        task, self._pods_task = self._pods_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pods_listed(self, items: list[Obj]) -> None:
        self._pods = {_name(p): p for p in items}
        self._recompute_all()
        await self._set_ready(True)
        if not self.synced.is_set():
            self.synced.set()
            log.info("InferencePool %s/%s: first sync done", self.namespace, self.pool_name)

    async def _set_ready(self, ready: bool) -> None:
        if ready == self.ready:
            return
        if self._on_ready is not None:
            await self._on_ready(ready)  # raises: state unchanged, the next list retries
        self.ready = ready

    async def _pod_event(self, kind: str, obj: Obj) -> None:
        name = _name(obj)
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = obj
        self._recompute(name)
        self._apply()

    # -- pods -> endpoints -> datastore ----------------------------------------------------
    def _recompute_all(self) -> None:
        for name in set(self._by_pod) | set(self._pods):
            self._recompute(name)
        self._apply()

    def _recompute(self, name: str) -> None:
        pod = self._pods.get(name)
        if pod is None or self.pool is None:
            self._by_pod.pop(name, None)
            return
        try:
            result = pod_endpoints(self.pool, pod, self._engine)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            # A shape the API server would not send; one odd pod must not stop the rest.
            problem = f"pod {pod_name(pod)}: unreadable ({exc!r}); left out"
            result = PodEndpoints(problems=(problem,))
        before = self._by_pod.get(name)
        self._by_pod[name] = result
        reported = set(before.problems) if before is not None else set()
        for problem in result.problems:
            if problem not in reported:
                log.warning("%s", problem)
                self._report(pod, problem)

    def _apply(self) -> None:
        wanted = {e.address: e for r in self._by_pod.values() for e in r.endpoints}
        change = diff(self._ours, wanted)
        apply(self._datastore, change)
        self._ours = wanted
        if change:
            log.info(
                "InferencePool %s/%s: %d endpoint(s) (%s)",
                self.namespace,
                self.pool_name,
                len(wanted),
                change.summary(),
            )

    def _report(self, pod: Obj, problem: str) -> None:
        """A Warning Event on the pod, so ``kubectl describe pod`` shows the problem."""
        meta = pod["metadata"]
        now = datetime.datetime.now(datetime.UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=self.namespace),
            involved_object=k8s.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                name=meta["name"],
                namespace=self.namespace,
                uid=meta.get("uid"),
            ),
            reason=EVENT_REASON,
            message=problem,
            type="Warning",
            source=k8s.V1EventSource(component="epp"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        task = asyncio.create_task(self._post_event(event))
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _post_event(self, event: k8s.CoreV1Event) -> None:
        try:
            await self._core.create_namespaced_event(self.namespace, event)
        except Exception as exc:  # an Event is a courtesy: the log line already said it
            log.debug("could not create Event: %s", exc)


def _name(pod: Obj) -> str:
    return str(pod["metadata"]["name"])


async def start_discovery(
    ref: PoolRef | SelectorRef,
    datastore: Datastore,
    default_engine: str,
    on_ready: Callable[[bool], Awaitable[None]],
    timing: WatchTiming | None = None,
    objectives: WatchedObjectives | None = None,
) -> PoolDiscovery:
    """Connect to the API server and start following ``ref``'s pool, or the pods its
    selector matches (inside the loop); with a pool and ``objectives``, its
    InferenceObjectives' priorities too (standalone mode has no pool to name)."""
    api = await api_client(ref.kubeconfig)
    namespace = ref.resolved_namespace()
    name = ref.name if isinstance(ref, PoolRef) else f"(selector {ref.label_selector})"
    discovery = PoolDiscovery(
        api,
        datastore,
        name,
        namespace,
        default_engine=default_engine,
        timing=timing,
        on_ready=on_ready,
        objectives=objectives if isinstance(ref, PoolRef) else None,
    )
    if isinstance(ref, PoolRef):
        discovery.start()
    else:
        # no pool object: port-discovery entries (which name a pool) never match here
        discovery.follow(PoolSpec("", namespace, dict(ref.match_labels), ref.target_ports))
    return discovery
