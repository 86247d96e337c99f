"""The llm-d Router's ``EndpointPickerConfig`` entries that are not scheduling plugins,
read into our sections so that the config files its chart ships load unchanged.

Pure: a parsed document in, a document of ours out (or ConfigError naming the entry).

* ``metrics-data-source``: how endpoints' ``/metrics`` are scraped; ours scrapes
  ``http://<endpoint>/metrics``, which is what the chart renders by default; any other
  scheme or path is refused.
* ``core-metrics-extractor``: which engine's metric names to read; its
  ``defaultEngine`` becomes ``dataLayer.engine``.
* request parsers (``openai-parser``, ``anthropic-parser``, ``vllmhttp-parser``,
  ``sglanghttp-parser``) and the ``requestHandler`` section: ours parses every one of
  those APIs always, each by its path (epp.common.apis); a parser we do not have is
  refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.common.apis import API_BY_PATH
from epp.common.params import ConfigError
from epp.datalayer.engines import ENGINES

METRICS_SOURCE = "metrics-data-source"
METRICS_EXTRACTOR = "core-metrics-extractor"
PARSERS = frozenset(api.name for api in API_BY_PATH.values())
REQUEST_HANDLER = "requestHandler"


def translate(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``doc`` with the entries above taken out of ``plugins`` and applied."""
    out = dict(doc)
    out.pop(REQUEST_HANDLER, None)  # only lists parsers, checked with the plugins
    plugins = doc.get("plugins")
    if not isinstance(plugins, list):
        return out
    kept: list[Any] = []
    data_layer = dict(doc.get("dataLayer") or {})
    for i, item in enumerate(plugins):
        kind = item.get("type") if isinstance(item, dict) else None
        where = f"{source}: plugins[{i}]"
        params = (item.get("parameters") or {}) if isinstance(item, dict) else {}
        if kind == METRICS_SOURCE:
            _check_scrape(params, where)
        elif kind == METRICS_EXTRACTOR:
            engine = params.get("defaultEngine")
            if engine is not None:
                if engine not in ENGINES:
                    raise ConfigError(
                        f"{where}.parameters.defaultEngine: {engine!r} is not a known "
                        f"engine; known: {sorted(ENGINES)}"
                    )
                data_layer["engine"] = engine
        elif isinstance(kind, str) and kind.endswith("-parser"):
            if kind not in PARSERS:
                raise ConfigError(
                    f"{where}.type: request parser {kind!r} is not supported; requests are "
                    f"parsed by their path's API ({', '.join(sorted(PARSERS))})"
                )
        else:
            kept.append(item)
    out["plugins"] = kept
    if data_layer:
        out["dataLayer"] = data_layer
    return out


def _check_scrape(params: Mapping[str, Any], where: str) -> None:
    scheme = params.get("scheme", "http")
    path = params.get("path", "/metrics")
    if scheme != "http" or path != "/metrics":
        raise ConfigError(
            f"{where}.parameters: endpoints are scraped at http://<endpoint>/metrics; "
            f"scheme {scheme!r} and path {path!r} are not supported"
        )
