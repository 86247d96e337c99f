"""What a process imports to start: a default ``epp serve`` and ``epp sim`` load none of
the heavy dependencies that only some configs or flags use (docs/testing.md, "Cheap
process start"). The tests start many such processes, each paying its imports in CPU
time, so a module that creeps back into the default path costs every test run.

Each check runs the real command to ready and stops it with SIGTERM; on its way out
the process writes the names of the modules it had loaded. Module presence, not time:
it cannot flake on a busy machine. A part that needs one of these modules imports it
where it is built or first used (``epp.common.lazymodule`` for a module used throughout
a class), so only the processes that use it pay.
"""

from __future__ import annotations

import sys
from pathlib import Path

from epp_harness.procs import ManagedProcess

# Runs `epp ARGS`, then (at exit) writes sys.modules to the file named first.
PROBE = """
import atexit, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
from epp.cli import main
sys.exit(main(sys.argv[2:]))
"""

# module -> who needs it; none of them is needed to serve with the defaults
SERVE_NEVER = {
    "grpc": "the grpcio transport, ORCA out-of-band streams",
    "jinja2": "the precise prefix scorer's chat templates",
    "tokenizers": "the precise prefix scorer's tokenizer",
    "zmq": "KV events, peer load (--peer-load-*)",
    "kubernetes_asyncio": "InferencePool discovery, leader election, --metrics-endpoint-auth",
    "opentelemetry": "--tracing",
    "cryptography": "TLS",
    "rich": "epp top",
    "epp_harness": "the dev harness, never",
    "epp.workers.group": "the parent of --workers",
    "epp.datalayer.orca_oob": "ORCA out-of-band streams",
    "yaml": "a config file; the effective config shown at --log-level info",
}
SIM_NEVER = {
    "zmq": "--kv-events-port",
    "msgspec": "--kv-events-port",
    "numpy": "nothing",
    "google.protobuf": "ORCA binary reports and streams",
    "grpc": "the ORCA stream server",
    "jinja2": "nothing",
    "tokenizers": "nothing",
    "kubernetes_asyncio": "nothing",
    "opentelemetry": "nothing",
    "cryptography": "nothing",
}

# as the tests' stacks run it (tests/e2e/conftest.py)
SERVE = ["serve", "--grpc-port", "0", "--http-port", "0", "--grpc-health-port", "0",
         "--log-level", "warning"]  # fmt: skip


def modules_at_exit(tmp_path: Path, *args: str) -> set[str]:
    """The modules ``epp ARGS`` had loaded once ready (stopped by SIGTERM)."""
    out, ready = tmp_path / "modules.txt", tmp_path / "probe.ready"
    proc = ManagedProcess(
        "probe",
        [sys.executable, "-c", PROBE, str(out), *args, "--ready-file", str(ready)],
        ready_file=ready,
        log_path=tmp_path / "probe.log",
    ).start()
    try:
        proc.wait_ready()
    finally:
        code = proc.stop()
    assert code == 0, proc.log_tail()
    return set(out.read_text().split())


def loaded(modules: set[str], never: dict[str, str]) -> dict[str, str]:
    """The ``never`` modules (or a submodule of one) in ``modules``, with who needs them."""
    return {
        name: why
        for name, why in never.items()
        if any(m == name or m.startswith(f"{name}.") for m in modules)
    }


def test_a_default_epp_serve_imports_no_optional_dependency(tmp_path: Path) -> None:
    modules = modules_at_exit(tmp_path, *SERVE, "--endpoint", "127.0.0.1:1")
    assert {"aiohttp", "epp.extproc.grpclib_transport"} <= modules  # it did serve
    assert loaded(modules, SERVE_NEVER) == {}


def test_a_default_epp_sim_imports_no_optional_dependency(tmp_path: Path) -> None:
    modules = modules_at_exit(tmp_path, "sim", "--port", "0")
    assert {"aiohttp", "epp_harness.sim.server"} <= modules
    assert loaded(modules, SIM_NEVER) == {}


def test_the_probe_sees_what_a_flag_imports_after_start_up(tmp_path: Path) -> None:
    """Modules imported while the process builds its parts count too: the grpcio
    transport is imported by name once the flags are read."""
    modules = modules_at_exit(tmp_path, *SERVE, "--transport", "grpcio")
    assert loaded(modules, SERVE_NEVER) == {"grpc": SERVE_NEVER["grpc"]}
