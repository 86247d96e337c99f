"""Logging for every ``epp`` subcommand: ``--log-level``, ``--log-format text|json``, and
the llm-d Router's spellings of both (``-v N``, ``--zap-encoder json|console``) that
``epp serve`` accepts.

JSON lines carry ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``, and
``request_id`` while a request's ext_proc stream is being handled (:data:`REQUEST_ID`,
set by the stream; asyncio gives each stream's task its own copy)."""

from __future__ import annotations

import argparse
import datetime
import logging
from contextvars import ContextVar

import orjson

from epp.common.argtypes import non_negative_int

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
DEFAULT_LEVEL = "info"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# the llm-d Router's -v: its default is 2; 4 and above turn on its debug lines
DEBUG_VERBOSITY = 4
ZAP_ENCODERS = {"json": "json", "console": "text"}

# the request whose ext_proc stream the running task handles ("" between requests)
REQUEST_ID: ContextVar[str] = ContextVar("epp_request_id", default="")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        help=f"log verbosity (default {DEFAULT_LEVEL})",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        help="text: one human-readable line per record; json: one JSON object per line "
        "(time, level, logger, message, request_id) (default text)",
    )


def add_router_logging(parser: argparse._ActionsContainer) -> None:
    """The llm-d Router's logging flags, mapped onto ours (docs/llm-d-router.md)."""
    parser.add_argument(
        "-v",
        "--v",
        type=non_negative_int,
        metavar="N",
        help=f"llm-d Router verbosity: {DEBUG_VERBOSITY} or more is --log-level debug, "
        "less is info; --log-level wins when both are given",
    )
    parser.add_argument(
        "--zap-encoder",
        choices=sorted(ZAP_ENCODERS),
        help="llm-d Router log encoder: json is --log-format json, console is text; "
        "--log-format wins when both are given",
    )


def level_of(args: argparse.Namespace) -> str:
    level: str | None = getattr(args, "log_level", None)
    if level is not None:
        return level
    verbosity: int | None = getattr(args, "v", None)
    if verbosity is not None:
        return "debug" if verbosity >= DEBUG_VERBOSITY else "info"
    return DEFAULT_LEVEL


def format_of(args: argparse.Namespace) -> str:
    fmt: str | None = getattr(args, "log_format", None)
    if fmt is not None:
        return fmt
    encoder: str | None = getattr(args, "zap_encoder", None)
    return ZAP_ENCODERS[encoder] if encoder is not None else "text"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        doc: dict[str, object] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id:
            doc["request_id"] = request_id
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(doc).decode()


def setup_logging(level: str = DEFAULT_LEVEL, fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
