"""Log level and format from our flags and the llm-d Router's; one JSON object per line."""

from __future__ import annotations

import argparse
import logging

import orjson
import pytest

from epp.observability.logsetup import REQUEST_ID, JsonFormatter, format_of, level_of


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        ({}, "info"),
        ({"v": 2}, "info"),
        ({"v": 3}, "info"),
        ({"v": 4}, "debug"),
        ({"v": 5, "log_level": "warning"}, "warning"),
        ({"log_level": "error"}, "error"),
    ],
)
def test_level(flags: dict[str, object], level: str) -> None:
    assert level_of(argparse.Namespace(**flags)) == level


@pytest.mark.parametrize(
    ("flags", "fmt"),
    [
        ({}, "text"),
        ({"zap_encoder": "json"}, "json"),
        ({"zap_encoder": "console"}, "text"),
        ({"zap_encoder": "json", "log_format": "text"}, "text"),
        ({"log_format": "json"}, "json"),
    ],
)
def test_format(flags: dict[str, object], fmt: str) -> None:
    assert format_of(argparse.Namespace(**flags)) == fmt


def record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("epp.router", logging.WARNING, __file__, 1, message, args, None)


def test_json_lines_carry_time_level_logger_message() -> None:
    token = REQUEST_ID.set("")  # between requests (other tests' streams set it here)
    try:
        line = JsonFormatter().format(record("picked %s", "10.0.0.1:8000\nnext"))
    finally:
        REQUEST_ID.reset(token)
    assert "\n" not in line
    doc = orjson.loads(line)
    assert doc["level"] == "warning" and doc["logger"] == "epp.router"
    assert doc["message"] == "picked 10.0.0.1:8000\nnext"
    assert doc["time"].endswith("Z") and "T" in doc["time"]
    assert "request_id" not in doc


def test_json_lines_name_the_request_being_handled() -> None:
    token = REQUEST_ID.set("req-7")
    try:
        doc = orjson.loads(JsonFormatter().format(record("rejected")))
    finally:
        REQUEST_ID.reset(token)
    assert doc["request_id"] == "req-7"


def test_json_lines_keep_tracebacks_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = logging.LogRecord("epp", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "ValueError: boom" in orjson.loads(line)["error"]
