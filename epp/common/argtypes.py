"""argparse value types shared by every subcommand, so bad flags get one clear wording."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from epp.common.addresses import parse_address
from epp.types import Endpoint, Role

T = TypeVar("T")


def checked(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a parser that raises ValueError with a precise message."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")  # argparse names it in errors
    return convert


def endpoint(role: Role = Role.DECODE) -> Callable[[str], Endpoint]:
    """``HOST:PORT`` (``[v6]:port``; HOST an IP or a name) as an Endpoint of ``role``."""
    return checked(lambda text: Endpoint(*parse_address(text), role))


def _http_url(text: str) -> str:
    given = text.strip()
    url = given if "://" in given else f"http://{given}"  # host:port alone: http
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{given!r}: use http:// or https://, not {parts.scheme}://")
    if not parts.hostname:
        raise ValueError(f"{given!r}: no host; expected [http[s]://]HOST:PORT")
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise ValueError(f"{given!r}: the port is not a number 0-65535") from None
    return url.rstrip("/")


# ``[http[s]://]HOST:PORT[/path]``: a URL, http:// when no scheme is given
http_url = checked(_http_url)


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def port(text: str) -> int:
    value = integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535 (0 = any free port), got {value}")
    return value


def positive_int(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def go_bool(text: str) -> bool:
    """A boolean as Go's flag packages parse it (``--flag=false``; ``--flag`` alone is
    true: give the argument ``nargs="?", const=True``)."""
    if text in GO_TRUE:
        return True
    if text in GO_FALSE:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (use true or false)")


def comma_ports(text: str) -> tuple[int, ...]:
    """``8000,8001``: one or more ports 1-65535, no duplicates kept."""
    ports: list[int] = []
    for part in text.split(","):
        value = integer(part.strip())
        if not 1 <= value <= 65535:
            raise argparse.ArgumentTypeError(f"port must be 1-65535, got {value}")
        if value not in ports:
            ports.append(value)
    return tuple(ports)
