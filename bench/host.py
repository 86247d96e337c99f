"""What the benchmarks read about the machine they run on (Linux /proc) and the code
they run (git)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parents[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies over all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already inside user
    return float(total - idle), float(total)


def machine_description() -> str:
    """e.g. ``x86_64, 2 cores (AMD EPYC ...), Python 3.11.7``."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.machine()}, {os.cpu_count()} cores{f' ({model})' if model else ''}, "
        f"Python {platform.python_version()}"
    )


def git_state() -> str:
    """The commit the run used, marked dirty when the tree had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "epp"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} + uncommitted changes under epp/" if dirty else head
