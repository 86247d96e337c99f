"""``epp config``: show the effective configuration, or list the plugin types."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from epp import config
from epp.datalayer.engines import ENGINES
from epp.disagg.coordinators import COORDINATORS
from epp.extensions import ExtensionError
from epp.scheduling.params import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["show", "plugins"],
        help="show: the config as `epp serve` would run it (defaults filled in); "
        "plugins: every plugin type with its kind",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="config file to check")


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "plugins":
            for name, plugin in sorted(config.builtin_registry().types().items()):
                print(f"{name:30} {plugin.kind:7} {plugin.summary}")
            return 0
        cfg = config.load(args.config)
        config.instantiate(cfg, config.builtin_registry())  # parameters checked too
        _load_installed(cfg)
    except (ConfigError, ExtensionError) as exc:
        print(f"epp config: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(f"# effective config from {cfg.source}\n{config.effective_yaml(cfg)}")
    return 0


def _load_installed(cfg: config.EppConfig) -> None:
    """Load the coordinator and engine dialects the config names, as ``epp serve``
    does: one an installed package adds may fail to (ExtensionError)."""
    COORDINATORS[cfg.disaggregation.coordinator]
    for engine in {cfg.data_layer.engine, *(e.engine for e in cfg.endpoints)}:
        ENGINES[engine]
