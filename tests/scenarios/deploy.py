"""A scenario's deployment shape, started with the project's own stack builders
(``LocalStack`` in this process, or ``epp stack`` as a user runs it), behind one small
interface: where to send requests, which servers there are and what each serves, the
pid of a server or EPP process, every EPP's HTTP URL, and (``LocalStack`` only) the
operations some faults need: Envoy restarted on its port, a server replaced by one on a
new port."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import yaml

from epp_harness.envoyproc import EnvoyProcess, write_config
from epp_harness.stack import LocalStack, StackDown, StackOptions
from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.model import ADAPTER, ADAPTERS, BASE_MODEL, IDLE_S, REWRITES
from tests.support.http import get_json
from tests.support.stackcli import RunningStack, running_stack
from tests.support.wait import wait_for

# every simulator: latencies as vLLM's defaults in the sim (so streams last long enough
# for a fault to land mid-way), prefill cheap enough that a 220 KB prompt fits in IDLE_S
SIM_ARGS = ["--time-scale", "1", "--prefill-ms-per-token", "0.005"]
CATALOGUE = {name: f"/adapters/{name}" for name in ADAPTERS}
ADMIN_KEY = "scenario-admin-key"  # the admin API's key in every LocalStack shape
PRECISE = Path(__file__).resolve().parents[2] / "configs" / "precise-prefix.yaml"
# the EPP's config file of the shapes that need one (YAML)
CONFIGS = {
    "lora-registered": {"models": {"adapters": CATALOGUE, "baseModels": [BASE_MODEL]}},
    "lora-on-demand": {
        "models": {"adapters": CATALOGUE},
        "loraPlacement": {
            "enabled": True,
            "unloadLeastRecentlyUsed": True,
            "maxAdaptersPerServer": 1,
        },
    },
    "model-rewrite": {
        "models": {"rewrites": {a: dict.fromkeys(t, 1) for a, t in REWRITES.items()}}
    },
    "pd-deferred": {"disaggregation": {"deferDecode": True}},
    "flow-control": {"saturationDetector": {"maxConcurrency": 1}, "flowControl": {"enabled": True}},
    "flow-control-off": {
        "saturationDetector": {"maxConcurrency": 1},
        "flowControl": {"enabled": False},
    },
}
COORDINATOR = {"pd-nixl": "nixl", "pd-sidecar": "sidecar", "pd-concurrent": "concurrent",
               "pd-kv-pool": "kv-pool", "pd-deferred": "nixl"}  # fmt: skip
SUBSET = ("lora-subset", "model-rewrite")  # ADAPTER preloaded on some of the 3 servers


def lora_holders(fault: str) -> int:
    """How many servers (sim-0 on) hold ADAPTER in the SUBSET shapes: two where a fault
    may take one down, so one holder lives through it; one where there is no fault, so
    two of three servers lack it (an EPP that does not know where it is misses often)."""
    return 1 if fault == "none" else 2


def _lora_each(holders: int) -> list[list[str]]:
    preloaded = ["--lora-modules", f"{ADAPTER}=/adapters/{ADAPTER}"]
    return [list(preloaded) for _ in range(holders)] + [["--enable-lora"]] * (3 - holders)


@dataclass(frozen=True)
class Server:
    name: str  # the stack's name for it: sim-0, decode-1, prefill-0
    address: str  # host:port, as x-sim-instance names it
    serves: frozenset[str]  # the base model and the adapters it holds or may load
    decodes: bool  # answers clients (a prefill-only server does not)
    endpoint: str = ""  # the EPP's address for it where that differs (its sidecar's)

    @property
    def in_epp(self) -> str:
        return self.endpoint or self.address


class Deployment(Protocol):
    url: str  # Envoy's listener

    def servers(self) -> list[Server]: ...

    def server_pid(self, name: str) -> int: ...

    def epp_pid(self, index: int) -> int: ...

    def epp_pids(self) -> list[int]: ...

    def epp_http_urls(self) -> list[str]: ...

    def envoy_admin_url(self) -> str: ...  # "" where it is not known


def _serves(name: str, shape: str, holders: int) -> frozenset[str]:
    if shape in ("lora-registered", "lora-on-demand"):
        return frozenset({BASE_MODEL, *ADAPTERS})
    lora = shape in SUBSET and name in {f"sim-{i}" for i in range(holders)}
    return frozenset({BASE_MODEL, ADAPTER} if lora else {BASE_MODEL})


class InProcess:
    """A ``LocalStack``, supervised as ``epp stack`` supervises it (a killed child is
    started again on its ports) by a thread of this process."""

    def __init__(self, stack: LocalStack, shape: str, holders: int) -> None:
        self.stack, self.shape = stack, shape
        self.url = stack.envoy_url
        args = stack.endpoint_args
        self._servers = [
            Server(p.name, a, _serves(p.name, shape, holders), not p.name.startswith("prefill"),
                   endpoint if endpoint != a else "")
            for p, a, endpoint in zip(stack.sims, stack.sim_addresses, args[1::2], strict=True)
        ]  # fmt: skip
        self._lock = threading.Lock()  # held while Envoy is swapped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                try:
                    self.stack.supervise()
                except StackDown:
                    return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def servers(self) -> list[Server]:
        return list(self._servers)

    def server_pid(self, name: str) -> int:
        return next(p.pid for p in self.stack.sims if p.name == name)

    def epp_pid(self, index: int) -> int:
        epps = [self.stack.epp, *self.stack.more_epps]
        proc = epps[index]
        assert proc is not None
        return proc.pid

    def epp_pids(self) -> list[int]:
        """Every EPP process: each replica and, with workers, each worker."""
        pids = [self.epp_pid(i) for i in range(1 + len(self.stack.more_epps))]
        if self.stack.opts.workers > 1:
            for url in self.epp_http_urls():
                pids += [int(w["pid"]) for w in get_json(f"{url}/workers")["workers"]]
        return pids

    def epp_http_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{http}" for _, http in self.stack.epp_ports]

    def envoy_admin_url(self) -> str:
        with self._lock:
            assert self.stack.envoy is not None
            return self.stack.envoy.admin_url

    def restart_envoy(self) -> None:
        """Stop Envoy and start it again on the same listener port (a new admin port)."""
        with self._lock:
            envoy = self.stack.envoy
            assert envoy is not None
            path = self.stack.workdir / "envoy.yaml"
            doc = yaml.safe_load(path.read_text())
            doc["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = (
                envoy.port
            )
            write_config(doc, path)
            envoy.stop()
            self.stack.envoy = EnvoyProcess(
                path, self.stack.workdir, concurrency=self.stack.opts.envoy_concurrency
            ).start()

    def replace_server(self, old: Server) -> Server:
        """Stop ``old`` for good and start a server like it on a new port (not yet known
        to the EPP: the caller tells it)."""
        sim = next(p for p in self.stack.sims if p.name == old.name)
        self.stack.retire_sim(sim)
        index = int(old.name.rsplit("-", 1)[1])
        each = self.stack.opts.sim_args_each
        new = self.stack.start_sim(f"{old.name}-new", *(each[index] if index < len(each) else []))
        self.stack.sims.append(new)  # stopped with the stack
        info = new.wait_ready()
        server = replace(old, name=new.name, address=f"{info['host']}:{info['port']}")
        self._servers = [server if s == old else s for s in self._servers]
        return server


class Cli:
    """``epp stack`` run as a user runs it (it supervises its children itself)."""

    def __init__(self, running: RunningStack, replicas: int) -> None:
        self.running, self.replicas = running, replicas
        self.url = running.url
        self._servers = [
            Server(n, f"127.0.0.1:{running.ready(n)['port']}", frozenset({BASE_MODEL}), True)
            for n in ("sim-0", "sim-1", "sim-2")
        ]
        # a restarted replica comes back on the same ports; its ready file is gone
        # meanwhile
        names = ["epp", *(f"epp-{i}" for i in range(1, replicas))]
        self._epp_urls = [f"http://127.0.0.1:{running.ready(n)['http_port']}" for n in names]

    def servers(self) -> list[Server]:
        return self._servers

    def server_pid(self, name: str) -> int:
        return self.running.pid(name)

    def epp_pid(self, index: int) -> int:
        return self.running.pid("epp" if index == 0 else f"epp-{index}")

    def epp_pids(self) -> list[int]:
        return [self.epp_pid(i) for i in range(self.replicas)]

    def epp_http_urls(self) -> list[str]:
        return self._epp_urls

    def envoy_admin_url(self) -> str:
        # its banner's line (epp stack restarts no Envoy); "" where an older banner
        # (another checkout's) has none
        _, found, rest = self.running.output().partition("Envoy admin")
        return rest.split()[0] if found else ""


def _options(shape: str, tmp: Path, stream_first_byte_s: float, holders: int) -> StackOptions:
    (tmp / "admin.key").write_text(ADMIN_KEY)
    base = StackOptions(
        envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0, log_level="warning",
        servers=3, sim_args=list(SIM_ARGS), first_byte_timeout_s=IDLE_S,
        stream_idle_timeout_s=stream_first_byte_s, stream_chunk_timeout_s=IDLE_S,
        workdir=tmp / "stack", epp_args=["--admin-api-key-file", str(tmp / "admin.key")],
    )  # fmt: skip
    if shape in CONFIGS:
        config = tmp / "epp.yaml"
        config.write_text(yaml.safe_dump(CONFIGS[shape]))
        base.epp_args += ["--config", str(config)]
    if shape in SUBSET:
        base.sim_args += ["--max-loras", "2"]
        base.sim_args_each = _lora_each(holders)
    elif shape == "lora-registered":
        modules = [f"{name}={path}" for name, path in CATALOGUE.items()]
        base.sim_args += ["--max-loras", "1", "--lora-modules", *modules]
    elif shape == "lora-on-demand":
        base.sim_args += ["--enable-lora", "--max-loras", "1"]
    elif shape == "workers-2":
        base.workers = 2
    elif shape == "replicas":
        base.replicas = 2
    elif shape in COORDINATOR:
        base.servers, base.prefill, base.decode = 0, 1, 2
        base.coordinator = COORDINATOR[shape]
    elif shape == "kv-events":
        base.kv_events = True
        base.epp_args += ["--config", str(PRECISE)]
    elif shape == "tls":
        base.epp_tls = True
    elif shape == "fail-open":
        base.fail_open, base.processing = True, "buffered"
    return base


def _lora_listed(stack: LocalStack, shape: str, holders: int) -> bool:
    """Whether the EPP lists the adapters on exactly the servers that hold them."""
    listed = get_json(f"{stack.epp_http_url}/lora/adapters")["servers"]
    if shape == "lora-registered":
        want = {a: sorted(ADAPTERS) for a in stack.sim_addresses}
    else:
        want = {a: ([ADAPTER] if i < holders else []) for i, a in enumerate(stack.sim_addresses)}
    return all(sorted(listed.get(a, ["?"])) == held for a, held in want.items())


def _wait_listed(stack: LocalStack, shape: str, holders: int, strict: bool) -> None:
    """Until the EPP lists the adapters where they are. Another checkout's EPP may never
    list them (before placement learned from every server's /v1/models, it listed only
    with loraPlacement on): the scenario then runs without, and is judged as it goes."""
    try:
        wait_for(
            lambda: _lora_listed(stack, shape, holders), 30, "the EPP lists the servers' adapters"
        )
    except (AssertionError, OSError) as exc:
        if strict:
            raise
        print(f"the EPP does not list the adapters; running without: {exc}", file=sys.stderr)


@contextmanager
def deployed(
    shape: str,
    tmp: Path,
    *,
    stream_first_byte_s: float = IDLE_S,
    epp_from: OtherCheckout | None = None,
    holders: int = 2,
) -> Iterator[Deployment]:
    """The shape running and ready for traffic; everything stopped after. Streams get
    ``stream_first_byte_s`` for their first byte (Envoy's per-try idle timeout on the
    streaming route); ``epp_from``: the EPP of another checkout (eppfrom.py);
    ``holders``: how many servers hold ADAPTER in the SUBSET shapes."""
    with ExitStack() as cleanup:
        if shape == "stack-replicas":
            flags = ["--servers", "3", "--replicas", "2", "--time-scale", "0.5"]
            for flag, value in (
                ("--first-byte-timeout", IDLE_S),
                ("--stream-idle-timeout", stream_first_byte_s),
                ("--stream-chunk-timeout", IDLE_S),
            ):
                flags += [flag, f"{value:g}"]
            running = cleanup.enter_context(
                running_stack(
                    tmp, *flags,
                    env=epp_from.env if epp_from else None,
                    adapt=epp_from.adapt if epp_from else None,
                )
            )  # fmt: skip
            yield Cli(running, replicas=2)
            return
        opts = _options(shape, tmp, stream_first_byte_s, holders)
        if epp_from is not None:
            opts.epp_env, opts.adapt_serve = epp_from.env, epp_from.adapt
        stack = cleanup.enter_context(LocalStack(opts))
        if shape in (*SUBSET, "lora-registered"):
            _wait_listed(stack, shape, holders, strict=epp_from is None)
        deployment = InProcess(stack, shape, holders)
        cleanup.callback(deployment.close)
        yield deployment
