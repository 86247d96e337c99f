"""Ready files: how a child process tells its parent it is listening, and on which ports.

Every server we start binds its ports first (port 0 allowed), then writes a small JSON
object to ``--ready-file`` atomically. The parent polls for the file, so no fixed ports
and no sleeps are needed to know a child is up.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson


def write_ready(path: str | os.PathLike[str] | None, info: dict[str, Any]) -> None:
    """Atomically write ``info`` as JSON to ``path`` (no-op when path is None)."""
    if path is None:
        return
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".ready-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(info))
            f.flush()
            os.fsync(f.fileno())  # durable before it replaces the old file (state files)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_ready(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ready info if the file exists, else None."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    info = orjson.loads(data)
    if not isinstance(info, dict):
        raise ValueError(f"ready file {path} does not hold a JSON object")
    return info
