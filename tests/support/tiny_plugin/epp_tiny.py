"""A tiny plugin package for epp: a scorer, a coordinator, a discovery source and an
engine metric dialect, each found through an entry point (see pyproject.toml)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from epp.plugin import (
    CoordinatorEnv,
    CycleContext,
    DecodeLeg,
    DiscoveryContext,
    DiscoveryKind,
    Endpoint,
    EndpointState,
    EngineMetricNames,
    Handoff,
    Params,
    PluginType,
    Role,
    parse_address,
)


# -- a scheduling plugin: `type: constant-scorer` in a config's plugins -----------------
class ConstantScorer:
    def __init__(self, value: float) -> None:
        self.value = value

    def score(self, ctx: CycleContext, candidates: Sequence[EndpointState]) -> list[float]:
        return [self.value] * len(candidates)


def constant_scorer(params: Params) -> ConstantScorer:
    return ConstantScorer(params.number("value", 1.0, minimum=0.0))


CONSTANT_SCORER = PluginType("scorer", constant_scorer, "the same score for every endpoint")


# -- a coordinator: `disaggregation.coordinator: header-only` or --coordinator ----------
class HeaderOnly:
    """Tells the decode server where the prefill server is, and nothing more."""

    name = "header-only"

    def __init__(self, env: CoordinatorEnv) -> None:
        self.env = env

    def hand_off(self, handoff: Handoff) -> DecodeLeg:
        return DecodeLeg(headers=(("x-prefiller-host-port", handoff.prefill.address),))

    async def close(self) -> None:
        pass


# -- a discovery source: the servers in $EPP_TINY_ENDPOINTS ("host:port,host:port") -----
class EnvList:
    def __init__(self, ctx: DiscoveryContext, addresses: list[str]) -> None:
        self.ctx = ctx
        self.addresses = addresses

    async def start(self) -> None:
        for address in self.addresses:
            host, port = parse_address(address)
            self.ctx.datastore.add(Endpoint(host, port, Role.DECODE, engine=self.ctx.engine))

    async def stop(self) -> None:
        pass


def env_list(ctx: DiscoveryContext) -> EnvList | None:
    listed = os.environ.get("EPP_TINY_ENDPOINTS", "")
    addresses = [a.strip() for a in listed.split(",") if a.strip()]
    return EnvList(ctx, addresses) if addresses else None  # None: not asked for


ENV_LIST = DiscoveryKind("servers listed in $EPP_TINY_ENDPOINTS", env_list)


# -- an engine metric dialect: `dataLayer.engine: tiny` ----------------------------------
TINY_ENGINE = EngineMetricNames(
    engine="tiny", waiting="tiny_queue", running="tiny_batch", kv_usage=("tiny_kv",)
)
