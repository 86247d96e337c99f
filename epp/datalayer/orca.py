"""ORCA load reports: response headers -> flat ``{key: value}`` dicts -> EndpointMetrics.

A model server may report its load with every response (header ``endpoint-load-metrics``
in the ``TEXT``, ``JSON`` or ``BIN`` encoding, or ``endpoint-load-metrics-bin``) or out of
band over ``OpenRcaService/StreamCoreMetrics`` (:mod:`epp.datalayer.orca_oob`). Every
encoding becomes the same flat dict, keyed as in the TEXT encoding:

``cpu_utilization``, ``mem_utilization``, ``application_utilization``,
``rps_fractional``, ``eps``, ``named_metrics.<name>``, ``utilization.<name>``,
``request_cost.<name>``.

The protobuf encodings cannot tell an unset top-level scalar from 0, so a top-level
scalar equal to 0 is left out of the dict whatever the encoding (a report means the
same however it travelled); map entries are kept even when 0. The deprecated integer
``rps`` field is ignored. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from xds.data.orca.v3.orca_load_report_pb2 import OrcaLoadReport

from epp.errors import InternalError
from epp.types import EndpointMetrics

# Header names as Envoy hands them over (lower case).
ORCA_HEADER = "endpoint-load-metrics"
ORCA_BIN_HEADER = "endpoint-load-metrics-bin"
# Request header asking vLLM (and the simulator) for ORCA response headers.
ORCA_FORMAT_HEADER = "endpoint-load-metrics-format"

SCALAR_FIELDS = (
    "cpu_utilization",
    "mem_utilization",
    "application_utilization",
    "rps_fractional",
    "eps",
)
MAP_FIELDS = ("named_metrics", "utilization", "request_cost")

# vLLM's named metrics and the EndpointMetrics field each one fills.
VLLM_NAMED_METRICS = {
    "named_metrics.kv_cache_usage_perc": "kv_usage",
    "named_metrics.num_requests_waiting": "waiting",
    "named_metrics.num_requests_running": "running",
}

# A plain decimal number; Python's float() would also take "nan", "inf" and "1_0".
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_SEPARATOR = re.compile(r"[=:]")


class OrcaParseError(InternalError, ValueError):
    """An ORCA header (or out-of-band report) that cannot be read; the message says why."""


def parse_orca(headers: Mapping[str, str]) -> dict[str, float] | None:
    """The ORCA report in ``headers`` (lower-case names) as a flat dict, or None when
    there is no ORCA header. Raises OrcaParseError on anything malformed."""
    text = headers.get(ORCA_HEADER)
    binary = headers.get(ORCA_BIN_HEADER)
    if text is None and binary is None:
        return None
    if text is not None and binary is not None:
        raise OrcaParseError(
            f"both {ORCA_HEADER} and {ORCA_BIN_HEADER} are present: cannot tell which to use"
        )
    if binary is not None:
        return report_to_dict(_decode_bin(binary, ORCA_BIN_HEADER))
    assert text is not None
    value = text.strip()
    prefix, _, body = value.partition(" ")
    if prefix == "TEXT":
        return _parse_text(body)
    if prefix == "JSON":
        return report_to_dict(_parse_json(body))
    if prefix == "BIN":
        return report_to_dict(_decode_bin(body, f"{ORCA_HEADER} BIN"))
    raise OrcaParseError(
        f"{ORCA_HEADER} must start with 'TEXT ', 'JSON ' or 'BIN ', got {_excerpt(value)}"
    )


def report_to_dict(report: Any) -> dict[str, float]:
    """An ``OrcaLoadReport`` message as the flat dict (the one conversion every source
    uses). Raises OrcaParseError on NaN, infinities or empty map keys."""
    values: dict[str, float] = {}
    for name in SCALAR_FIELDS:
        value = getattr(report, name)
        if value != 0:
            values[name] = _finite(name, value)
    for field in MAP_FIELDS:
        for key, value in getattr(report, field).items():
            if not key:
                raise OrcaParseError(f"{field} has an entry with an empty name")
            name = f"{field}.{key}"
            values[name] = _finite(name, value)
    return values


def merge_orca(
    previous: EndpointMetrics | None, report: Mapping[str, float], now: float
) -> EndpointMetrics:
    """New metrics for an endpoint that just sent ``report``.

    ORCA is fresher than the last scrape but reports less: vLLM's named metrics replace
    ``kv_usage``, ``waiting`` and ``running`` when present; every other field keeps its
    previous value. ``orca`` becomes ``report`` and ``updated_at`` becomes ``now``.
    """
    fields: dict[str, Any] = {}
    for key, attr in VLLM_NAMED_METRICS.items():
        if key in report:
            fields[attr] = report[key]
    if previous is None:
        return EndpointMetrics(updated_at=now, orca=dict(report), **fields)
    return replace(previous, updated_at=now, orca=dict(report), **fields)


def _parse_text(body: str) -> dict[str, float]:
    """``key=value, key:value, ...`` (whitespace around every part allowed)."""
    report = OrcaLoadReport()
    seen: set[str] = set()
    if not body.strip():
        return {}
    for position, entry in enumerate(body.split(","), start=1):
        item = entry.strip()
        if not item:
            raise OrcaParseError(f"{ORCA_HEADER} TEXT: entry {position} is empty")
        parts = _SEPARATOR.split(item, maxsplit=1)
        if len(parts) != 2:
            raise OrcaParseError(
                f"{ORCA_HEADER} TEXT: entry {position} {_excerpt(item)} is not key=value"
            )
        key, raw = parts[0].strip(), parts[1].strip()
        if not key:
            raise OrcaParseError(f"{ORCA_HEADER} TEXT: entry {position} has an empty key")
        if key in seen:
            raise OrcaParseError(f"{ORCA_HEADER} TEXT: duplicate key {key!r}")
        seen.add(key)
        if not _NUMBER.fullmatch(raw):
            raise OrcaParseError(
                f"{ORCA_HEADER} TEXT: value of {key!r} is not a finite number: {_excerpt(raw)}"
            )
        value = _finite(key, float(raw))
        field, dot, name = key.partition(".")
        if dot:
            if field not in MAP_FIELDS:
                raise OrcaParseError(f"{ORCA_HEADER} TEXT: unknown key {key!r}")
            if not name:
                raise OrcaParseError(f"{ORCA_HEADER} TEXT: key {key!r} has an empty name")
            getattr(report, field)[name] = value
        elif key in SCALAR_FIELDS:
            setattr(report, key, value)
        else:
            raise OrcaParseError(f"{ORCA_HEADER} TEXT: unknown key {key!r}")
    return report_to_dict(report)


def _parse_json(body: str) -> Any:
    report = OrcaLoadReport()
    try:
        json_format.Parse(body, report)
    except json_format.ParseError as exc:
        # protobuf appends a list of valid fields on further lines: keep the first
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OrcaParseError(f"{ORCA_HEADER} JSON is not an OrcaLoadReport: {reason}") from None
    return report


def _decode_bin(text: str, where: str) -> Any:
    data = text.strip()
    # gRPC sends -bin headers unpadded; both forms are accepted.
    data += "=" * (-len(data) % 4)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OrcaParseError(f"{where} is not valid base64: {exc}") from None
    try:
        return OrcaLoadReport.FromString(raw)
    except DecodeError as exc:
        raise OrcaParseError(f"{where} is not a serialized OrcaLoadReport: {exc}") from None


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise OrcaParseError(f"ORCA value of {name!r} must be finite, got {value}")
    return float(value)


def _excerpt(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
