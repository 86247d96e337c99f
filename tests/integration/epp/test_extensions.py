"""A plugin package installed beside epp (pip, from its pyproject.toml) adds a scorer, a
coordinator, a discovery source and an engine metric dialect through entry points;
`epp config` and `epp serve` use them from a config with no change to epp. The package
is tests/support/tiny_plugin, the example of docs/extending.md."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from epp_harness.procs import ManagedProcess, epp_argv
from tests.support.http import get_json, metric_sum, request
from tests.support.wait import wait_for

PACKAGE = Path(__file__).parents[2] / "support" / "tiny_plugin"
CONFIG = """\
plugins:
- type: decode-filter
- type: constant-scorer
  parameters: {value: 0.5}
- type: max-score-picker
dataLayer:
  engine: tiny
  scrapeIntervalSeconds: 0.05
disaggregation:
  coordinator: header-only
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package pip-installed into a directory of its own (offline: the build uses
    this venv's setuptools)."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PACKAGE, root / "src")  # the build writes beside the sources
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(root / "site"), str(source)],
        check=True,
        timeout=120,
    )  # fmt: skip
    return root / "site"


def env_with(site: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return {**env, **extra}


def epp(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        epp_argv(*args), env=env_with(site), capture_output=True, text=True, timeout=60
    )


def test_config_lists_and_checks_what_the_package_adds(site: Path, tmp_path: Path) -> None:
    listed = epp(site, "config", "plugins")
    assert listed.returncode == 0, listed.stderr
    assert "constant-scorer                scorer  the same score for every endpoint" in (
        listed.stdout
    )
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    shown = epp(site, "config", "show", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "type: constant-scorer" in shown.stdout
    assert "coordinator: header-only" in shown.stdout and "engine: tiny" in shown.stdout
    # without the package the same file names unknown things
    missing = subprocess.run(
        epp_argv("config", "show", "--config", str(config)), capture_output=True, text=True
    )
    assert missing.returncode == 2
    assert "unknown plugin type 'constant-scorer'" in missing.stderr


class _TinyServer(BaseHTTPRequestHandler):
    """A model server speaking the tiny engine's metric dialect."""

    def do_GET(self) -> None:
        body = b"tiny_queue 3\ntiny_batch 2\ntiny_kv 0.25\n" if self.path == "/metrics" else b"{}"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tiny_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TinyServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_serve_uses_the_source_the_dialect_and_the_coordinator(
    site: Path, tmp_path: Path, tiny_server: str
) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    ready = tmp_path / "epp.ready"
    proc = ManagedProcess(
        "epp",
        epp_argv("serve", "--grpc-port", "0", "--http-port", "0",
                 "--grpc-health-port", "0", "--config", str(config),
                 "--ready-file", str(ready)),
        ready_file=ready,
        log_path=tmp_path / "epp.log",
        env=env_with(site, EPP_TINY_ENDPOINTS=tiny_server),
    ).start()  # fmt: skip
    try:
        http = f"http://127.0.0.1:{proc.wait_ready()['http_port']}"
        _, _, body = request(f"{http}/metrics")
        assert metric_sum(body.decode(), 'epp_endpoints{role="decode"}') == 1  # the source's

        def load() -> dict[str, float] | None:
            members = get_json(f"{http}/status")["endpoints"]
            return members[0].get("load") if members else None

        got = wait_for(load, what="the tiny server's load, read in its dialect")
        assert (got["waiting"], got["running"], got["kv_cache_usage"]) == (3, 2, 0.25)
    finally:
        proc.stop()
    log = (tmp_path / "epp.log").read_text()
    assert f"coordinator header-only, 1 endpoint(s): {tiny_server} (decode)" in log


def test_a_broken_entry_point_stops_config_and_serve_naming_it(tmp_path: Path) -> None:
    site = tmp_path / "site"  # what pip leaves of a package whose module went missing
    dist = site / "epp_broken-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: epp-broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[epp.coordinators]\nbroken = epp_broken:Gone\n")
    config = tmp_path / "c.yaml"
    config.write_text("disaggregation: {coordinator: broken}\n")
    message = (
        "entry point epp.coordinators 'broken' (epp_broken:Gone from epp-broken 1.0): "
        "cannot load: ModuleNotFoundError: No module named 'epp_broken'"
    )
    shown = epp(site, "config", "show", "--config", str(config))
    assert shown.returncode == 2 and message in shown.stderr, shown.stderr
    served = epp(
        site,
        "serve",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        "--grpc-health-port",
        "0",
        "--coordinator",
        "broken",
    )
    assert served.returncode == 2 and message in served.stderr, served.stderr
