"""Filters: narrow candidates by role, labels or saturation (LoRA: lora.py)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.common.params import ConfigError, Params
from epp.flowcontrol.saturation import SaturationConfig, endpoint_saturation
from epp.scheduling.base import CycleContext
from epp.scheduling.columns import select, snapshot_columns
from epp.types import EndpointState, Role


class RoleFilter:
    """Keeps endpoints whose P/D role is one of ``roles``."""

    def __init__(self, roles: frozenset[Role]) -> None:
        self.roles = roles
        # a tuple: `in` compares enum members by identity first (no Python-level hash)
        self._roles = tuple(roles)

    def filter(
        self, ctx: CycleContext, candidates: Sequence[EndpointState]
    ) -> Sequence[EndpointState]:
        snapshot = ctx.snapshot
        if candidates is not snapshot.endpoints or not ctx.vectorize(candidates):
            return [s for s in candidates if s.endpoint.role in self._roles]
        # roles are part of the snapshot: filter its endpoints once per snapshot, by
        # its role column
        key = ("role-filter", self.roles)
        kept: tuple[EndpointState, ...] | None = snapshot.derived.get(key)
        if kept is None:
            mask = snapshot_columns(snapshot).with_role(self._roles)
            kept = snapshot.derived[key] = select(snapshot, mask)
        return kept


def role_filter(p: Params) -> RoleFilter:
    names = p.strings("roles", ("decode", "prefill-decode"))
    roles = set()
    for name in names:
        try:
            roles.add(Role.parse(name))
        except ValueError as exc:
            raise ConfigError(f"{p.where}.roles: {exc}") from None
    return RoleFilter(frozenset(roles))


def decode_filter(p: Params) -> RoleFilter:
    """Endpoints that can decode: role decode or prefill-decode."""
    return RoleFilter(frozenset({Role.DECODE, Role.BOTH}))


def prefill_filter(p: Params) -> RoleFilter:
    """Endpoints that can prefill: role prefill or prefill-decode."""
    return RoleFilter(frozenset({Role.PREFILL, Role.BOTH}))


class LabelSelectorFilter:
    """Keeps endpoints carrying every label in ``matchLabels``."""

    def __init__(self, match: dict[str, str]) -> None:
        self.match = match

    def filter(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[EndpointState]:
        return [
            s
            for s in candidates
            if all(s.endpoint.labels.get(k) == v for k, v in self.match.items())
        ]


def label_selector_filter(p: Params) -> LabelSelectorFilter:
    return LabelSelectorFilter(p.mapping("matchLabels"))


class SaturationFilter:
    """Drops saturated endpoints (epp.flowcontrol.saturation.endpoint_saturation) unless
    all are."""

    def __init__(self, cfg: SaturationConfig) -> None:
        self.cfg = cfg

    def filter(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[EndpointState]:
        kept = [s for s in candidates if endpoint_saturation(ctx.metrics(s), self.cfg) < 1.0]
        return kept or list(candidates)


def saturation_filter(p: Params) -> SaturationFilter:
    """Thresholds default to the ``saturationDetector`` section's defaults."""
    d = SaturationConfig()
    return SaturationFilter(
        SaturationConfig(
            queue_threshold=p.number("queueThreshold", d.queue_threshold, minimum=1e-9),
            kv_threshold=p.number("kvThreshold", d.kv_threshold, minimum=1e-9),
        )
    )
