"""A scenario's deployment shape, started with the project's own stack builders
(``LocalStack`` in this process, or ``epp stack`` as a user runs it), behind one small
interface: where to send requests, which servers there are and what each serves, the
pid of a server or EPP replica, every EPP's HTTP URL."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from epp_harness.stack import LocalStack, StackDown, StackOptions
from tests.scenarios.eppfrom import OtherCheckout
from tests.scenarios.model import ADAPTER, BASE_MODEL, IDLE_S
from tests.support.http import get_json
from tests.support.stackcli import RunningStack, running_stack
from tests.support.wait import wait_for

# every simulator: latencies as vLLM's defaults in the sim (so streams last long enough
# for a fault to land mid-way), prefill cheap enough that a 220 KB prompt fits in IDLE_S
SIM_ARGS = ["--time-scale", "1", "--prefill-ms-per-token", "0.005"]
LORA_EACH = [["--lora-modules", f"{ADAPTER}=/adapters/{ADAPTER}"]] * 2 + [["--enable-lora"]]


@dataclass(frozen=True)
class Server:
    name: str  # the stack's name for it: sim-0, decode-1, prefill-0
    address: str  # host:port, as x-sim-instance names it
    serves: frozenset[str]  # the base model and the adapters it holds
    decodes: bool  # answers clients (a prefill-only server does not)


class Deployment(Protocol):
    url: str  # Envoy's listener

    def servers(self) -> list[Server]: ...

    def server_pid(self, name: str) -> int: ...

    def epp_pid(self, index: int) -> int: ...

    def epp_http_urls(self) -> list[str]: ...


def _serves(name: str, shape: str) -> frozenset[str]:
    lora = shape == "lora-subset" and name in ("sim-0", "sim-1")
    return frozenset({BASE_MODEL, ADAPTER} if lora else {BASE_MODEL})


class InProcess:
    """A ``LocalStack``, supervised as ``epp stack`` supervises it (a killed child is
    started again on its ports) by a thread of this process."""

    def __init__(self, stack: LocalStack, shape: str) -> None:
        self.stack, self.shape = stack, shape
        self.url = stack.envoy_url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.stack.supervise()
            except StackDown:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def servers(self) -> list[Server]:
        return [
            Server(p.name, a, _serves(p.name, self.shape), not p.name.startswith("prefill"))
            for p, a in zip(self.stack.sims, self.stack.sim_addresses, strict=True)
        ]

    def server_pid(self, name: str) -> int:
        return next(p.pid for p in self.stack.sims if p.name == name)

    def epp_pid(self, index: int) -> int:
        epps = [self.stack.epp, *self.stack.more_epps]
        proc = epps[index]
        assert proc is not None
        return proc.pid

    def epp_http_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{http}" for _, http in self.stack.epp_ports]


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

    def epp_http_urls(self) -> list[str]:
        return self._epp_urls


def _options(shape: str, stream_first_byte_s: float) -> StackOptions:
    base = StackOptions(
        envoy_port=0, envoy_admin_port=0, grpc_port=0, http_port=0, log_level="warning",
        servers=3, sim_args=list(SIM_ARGS), first_byte_timeout_s=IDLE_S,
        stream_idle_timeout_s=stream_first_byte_s, stream_chunk_timeout_s=IDLE_S,
    )  # fmt: skip
    if shape == "lora-subset":
        base.sim_args += ["--max-loras", "2"]
        base.sim_args_each = [list(a) for a in LORA_EACH]
    elif shape == "workers-2":
        base.workers = 2
    elif shape == "pd-nixl":
        base.servers, base.prefill, base.decode, base.coordinator = 0, 1, 2, "nixl"
    return base


def _lora_listed(stack: LocalStack) -> bool:
    """Whether the EPP lists the adapter on exactly the servers that hold it."""
    listed = get_json(f"{stack.epp_http_url}/lora/adapters")["servers"]
    want = {a: ([ADAPTER] if i < 2 else []) for i, a in enumerate(stack.sim_addresses)}
    return all(sorted(listed.get(a, ["?"])) == held for a, held in want.items())


def _wait_listed(stack: LocalStack, strict: bool) -> None:
    """Until the EPP lists the adapters where they are. Another checkout's EPP may never
    list them (before placement learned from every server's /v1/models, it listed only
    with loraPlacement on): the scenario then runs without, and is judged as it goes."""
    try:
        wait_for(lambda: _lora_listed(stack), 30, "the EPP lists every server's adapters")
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
) -> Iterator[Deployment]:
    """The shape running and ready for traffic; everything stopped after. Streams get
    ``stream_first_byte_s`` for their first byte (Envoy's per-try idle timeout on the
    streaming route); ``epp_from``: the EPP of another checkout (eppfrom.py)."""
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
        opts = _options(shape, stream_first_byte_s)
        if epp_from is not None:
            opts.epp_env, opts.adapt_serve = epp_from.env, epp_from.adapt
        stack = cleanup.enter_context(LocalStack(opts))
        if shape == "lora-subset":
            _wait_listed(stack, strict=epp_from is None)
        deployment = InProcess(stack, shape)
        cleanup.callback(deployment.close)
        yield deployment
