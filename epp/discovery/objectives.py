"""InferenceObjectives: the priority each objective of the pool's namespace gives the
requests that name it (``x-llm-d-inference-objective``, alias
``x-gateway-inference-objective``: the objective's ``metadata.name``).

The Gateway API Inference Extension's ``InferenceObjective``
(``inference.networking.x-k8s.io/v1alpha2``) carries ``spec.priority`` (an integer,
negative allowed; unset means 0) and names the pools it applies to: ``spec.poolRef``
(the older single reference), ``spec.poolRefs`` (a list), or ``spec.poolSelector`` (a
label selector matched against the InferencePool's labels). Only the objectives that
apply to the followed pool count. The priorities land in a mapping the scheduler reads
beside the config's ``admission.objectives`` (the config wins: docs/flow-control.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from epp.discovery.pool_endpoints import POOL_GROUP
from epp.discovery.reflector import Obj, Reflector, WatchTiming
from epp.errors import InternalError
from epp.flowcontrol.saturation import WatchedObjectives

log = logging.getLogger(__name__)

OBJECTIVE_GROUP = "inference.networking.x-k8s.io"
OBJECTIVE_VERSION = "v1alpha2"
OBJECTIVE_PLURAL = "inferenceobjectives"


class ObjectiveError(InternalError, ValueError):
    """An InferenceObjective this EPP cannot read (the message names it)."""


def objective_priority(obj: Obj, pool: str, pool_labels: Mapping[str, str]) -> int | None:
    """``obj``'s priority if it applies to the pool named ``pool`` (labelled
    ``pool_labels``), else None. Raises ObjectiveError for a malformed one."""
    name = f"InferenceObjective {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise ObjectiveError(f"{name}: spec is not an object")
    priority = spec.get("priority", 0)
    if priority is None:
        priority = 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ObjectiveError(f"{name}: spec.priority {priority!r} is not an integer")
    refs = list(spec.get("poolRefs") or [])
    if spec.get("poolRef"):
        refs.append(spec["poolRef"])
    if any(_names_pool(ref, pool, name) for ref in refs):
        return priority
    selector = spec.get("poolSelector")
    if selector and _selects(selector, pool_labels, name):
        return priority
    return None


def _names_pool(ref: Any, pool: str, name: str) -> bool:
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
        raise ObjectiveError(f"{name}: a pool reference without a name: {ref!r}")
    group = ref.get("group") or POOL_GROUP
    kind = ref.get("kind") or "InferencePool"
    return bool(ref["name"] == pool and group == POOL_GROUP and kind == "InferencePool")


def _selects(selector: Any, labels: Mapping[str, str], name: str) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against ``labels``."""
    if not isinstance(selector, dict):
        raise ObjectiveError(f"{name}: spec.poolSelector is not an object")
    match_labels = selector.get("matchLabels") or {}
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        test = _OPERATORS.get(op)
        if not isinstance(key, str) or test is None:
            raise ObjectiveError(f"{name}: spec.poolSelector: unsupported expression {expr!r}")
        if not test(labels, key, values):
            return False
    return True


_OPERATORS: dict[str, Callable[[Mapping[str, str], str, list[str]], bool]] = {
    "In": lambda labels, key, values: key in labels and labels[key] in values,
    "NotIn": lambda labels, key, values: labels.get(key) not in values,
    "Exists": lambda labels, key, values: key in labels,
    "DoesNotExist": lambda labels, key, values: key not in labels,
}


class ObjectiveWatch:
    """Keeps ``priorities`` (objective name -> priority) equal to the InferenceObjectives
    of ``namespace`` that apply to the pool ``pool``, through one reflector."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        namespace: str,
        pool: str,
        priorities: WatchedObjectives,
        timing: WatchTiming,
    ) -> None:
        self.priorities = priorities
        self._namespace = namespace
        self._pool = pool
        self._labels: Mapping[str, str] = {}
        self._objects: dict[str, Obj] = {}
        self._reported: set[str] = set()  # problems already logged
        self.reflector = Reflector(
            f"InferenceObjectives {namespace}",
            list_fn,
            {
                "group": OBJECTIVE_GROUP,
                "version": OBJECTIVE_VERSION,
                "namespace": namespace,
                "plural": OBJECTIVE_PLURAL,
            },
            self._listed,
            self._event,
            timing,
        )

    def pool_labels(self, labels: Mapping[str, str]) -> None:
        """The pool's labels (for ``poolSelector``), as its object now has them."""
        if dict(labels) != dict(self._labels):
            self._labels = dict(labels)
            self._apply()

    async def _listed(self, items: list[Obj]) -> None:
        self._objects = {str(o["metadata"]["name"]): o for o in items}
        self._apply()

    async def _event(self, kind: str, obj: Obj) -> None:
        name = str(obj["metadata"]["name"])
        if kind == "DELETED":
            self._objects.pop(name, None)
        else:
            self._objects[name] = obj
        self._apply()

    def _apply(self) -> None:
        wanted: dict[str, int] = {}
        for name, obj in self._objects.items():
            try:
                priority = objective_priority(obj, self._pool, self._labels)
            except (ObjectiveError, KeyError, AttributeError, TypeError) as exc:
                problem = str(exc) if isinstance(exc, ObjectiveError) else f"{name}: {exc!r}"
                if problem not in self._reported:
                    self._reported.add(problem)
                    log.warning("%s; left out", problem)
                continue
            if priority is not None:
                wanted[name] = priority
        if not self.priorities.replace(wanted):
            return
        log.info(
            "InferenceObjectives for pool %s/%s: %s",
            self._namespace,
            self._pool,
            ", ".join(f"{n}={p}" for n, p in sorted(wanted.items())) or "none",
        )
