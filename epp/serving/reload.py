"""``epp serve --config FILE`` follows FILE without a restart.

A reload (on SIGHUP, or when polling finds the file's content changed) reads the whole
file, validates it and builds the new scheduler with its plugins. Only when all of that
succeeded does the router switch to the new scheduler, in one assignment between two
requests: a request already routed finishes as it was routed, the next one is routed by
the new config. On any error the previous config keeps running, the error is logged and
``epp_config_reloads_total{result="failure"}`` counts it.

A reload can change ``plugins``, ``schedulingProfiles``, ``saturationDetector``,
``admission``, ``latencyModel``, ``models`` and ``conformance``. ``dataLayer``,
``disaggregation``, ``flowControl``, ``endpoints`` and ``loraPlacement`` are wired into
running tasks at start: a file that changes any of them is rejected as a whole (restart
to apply it). Plugins whose spec (type, name, parameters) is unchanged are kept with
what they learned (a prefix index, a session table); plugins that refer to others (the
P/D handler) are bound again to the new config's plugins. A changed ``latencyModel``
restarts the latency model from the new priors. Plugins that read KV events (a precise
prefix scorer) have subscribers started with them, so adding, removing or changing one
is also a restart.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from epp import config
from epp.common.looptask import LoopTask
from epp.common.params import ConfigError
from epp.datalayer.kvevents import KvEventSource
from epp.router import Router
from epp.scheduling.scheduler import ProfileScheduler

log = logging.getLogger("epp.serving.reload")

DEFAULT_POLL_S = 2.0
SETTLE_S = 0.2  # after a change is seen, before the file is read for the reload
# EppConfig attribute -> its YAML key, for what only a restart applies
RESTART_ONLY = (
    ("data_layer", "dataLayer"),
    ("disaggregation", "disaggregation"),
    ("flow_control", "flowControl"),
    ("endpoints", "endpoints"),
    ("lora_placement", "loraPlacement"),
)


class ConfigFile:
    """The config as ``epp serve`` reads it: FILE, else ``text`` (``--config-text``,
    never reloaded), else the built-in default, with the flags that override it applied.
    Remembers what it last read."""

    def __init__(
        self,
        path: Path | None,
        overrides: Callable[[config.EppConfig], config.EppConfig] = lambda cfg: cfg,
        *,
        text: str | None = None,
    ) -> None:
        self.path = path
        self._given = text
        self._overrides = overrides
        self._stamp: tuple[int, int, int] | None = None  # (mtime ns, size, inode) last read
        self._text: str | None = None  # what was last read
        self._missing = False

    def load(self) -> config.EppConfig:
        """Read and validate the file (raises ConfigError naming file and key)."""
        if self.path is None:
            if self._given is not None:
                return self._overrides(config.load_text(self._given, "--config-text"))
            return self._overrides(config.load(None))
        stamp = self._stat()
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read config file: {exc.strerror}") from None
        self._stamp, self._text = stamp, text
        return self._overrides(config.load_text(text, str(self.path)))

    def changed(self) -> bool:
        """Whether the file now holds other text than was last read (an untouched file
        costs one stat). A file that is gone is not a change: the config read stays."""
        if self.path is None:
            return False
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            text = self.path.read_text()
        except OSError:
            return False
        return text != self._text

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = self.path.stat()
        except OSError as exc:
            if not self._missing and self._text is not None:  # what was read stays
                log.warning(
                    "config file %s: %s; still running the config last read from it",
                    self.path,
                    exc.strerror,
                )
            self._missing = True
            return None
        self._missing = False
        return st.st_mtime_ns, st.st_size, st.st_ino


class ConfigReloader:
    """Reloads ``file`` on SIGHUP and, every ``poll_s`` seconds (0: never), when its
    content changed; switches ``router`` to the new scheduler when all of it is valid."""

    def __init__(
        self,
        file: ConfigFile,
        running: config.EppConfig,
        scheduler: ProfileScheduler,
        router: Router,
        reloads: Counter,
        *,
        poll_s: float = DEFAULT_POLL_S,
        on_sighup: Callable[[], None] = lambda: None,
    ) -> None:
        self.file = file
        self.config = running
        self.scheduler = scheduler
        self._router = router
        self._success = reloads.labels("success")
        self._failure = reloads.labels("failure")
        self._poll_s = poll_s
        self._poller = LoopTask("config-poll", self._poll)
        self._sighup = False
        self._on_sighup = on_sighup  # also done on SIGHUP (--workers: passed on to each)

    def start(self) -> None:
        """Inside the running loop: watch for SIGHUP and poll the file."""
        if self.file.path is None:
            return
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._hangup)
        self._sighup = True
        if self._poll_s > 0:
            self._poller.start()

    async def stop(self) -> None:
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        await self._poller.stop()

    def _hangup(self) -> None:
        self.reload("SIGHUP")
        self._on_sighup()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            if self.file.changed():
                await asyncio.sleep(SETTLE_S)  # a writer may truncate first, then write
                self.reload("the file changed")

    def reload(self, why: str) -> bool:
        """Load, check and build the new config; switch to it only if all succeeded."""
        try:
            cfg = self.file.load()
            restart = [key for attr, key in RESTART_ONLY if _differs(cfg, self.config, attr)]
            if restart:
                raise ConfigError(
                    f"{cfg.source}: {', '.join(restart)} changed, and only a restart "
                    "applies that; nothing of this file was applied"
                )
            scheduler = self._build(cfg)
            _check_kv_event_plugins(scheduler, self.scheduler, cfg.source)
            yaml = config.effective_yaml(cfg)
        except ConfigError as exc:
            self._failure.inc()
            log.error("config reload (%s) failed; the previous config still runs: %s", why, exc)
            return False
        except Exception:
            self._failure.inc()
            log.exception("config reload (%s) failed; the previous config still runs", why)
            return False
        # the switch: nothing below can fail, and no request runs in between
        if cfg.latency != self.config.latency:
            scheduler.latency.reset(cfg.latency)
        self._router.scheduler = scheduler
        self._router.models = cfg.models
        self._router.echo_served_endpoint = cfg.conformance.echo_served_endpoint
        self.config, self.scheduler = cfg, scheduler
        self._success.inc()
        log.info("config reloaded (%s) from %s:\n%s", why, cfg.source, yaml.rstrip())
        return True

    def _build(self, cfg: config.EppConfig) -> ProfileScheduler:
        old = self.scheduler
        keep: dict[str, Any] = {}
        for spec in cfg.plugins:
            instance = old.plugins.get(spec.name)
            if spec in self.config.plugins:  # instantiate binds it again
                keep[spec.name] = instance
        return config.instantiate(
            cfg,
            config.builtin_registry(),
            old.clock,
            reuse=keep,
            latency=old.latency,
            objectives=old.objectives,
        )


def _check_kv_event_plugins(new: ProfileScheduler, old: ProfileScheduler, source: str) -> None:
    """The plugins that read KV events must be the very ones the subscribers feed."""
    was = {n: p for n, p in old.plugins.items() if isinstance(p, KvEventSource)}
    now = {n: p for n, p in new.plugins.items() if isinstance(p, KvEventSource)}
    changed = sorted(n for n in was.keys() | now.keys() if was.get(n) is not now.get(n))
    if changed:
        raise ConfigError(
            f"{source}: plugin(s) {', '.join(changed)} read KV events and were added, "
            "removed or changed; only a restart applies that; nothing of this file was applied"
        )


def _differs(new: config.EppConfig, old: config.EppConfig, attr: str) -> bool:
    return bool(getattr(new, attr) != getattr(old, attr))
