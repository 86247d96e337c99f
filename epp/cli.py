"""The single ``epp`` entry point: ``epp serve | sim | stack | sidecar | config | top``, and
``epp --flag ...`` (flags with no command) as ``epp serve --flag ...``.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them together. Modules are named by string
and imported only for the command being run: ``sim`` and ``stack`` live in the dev
harness (``epp_harness``), which the product never imports statically.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from epp import __version__
from epp.observability.logsetup import format_of, level_of, setup_logging

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "epp.serving.serve",
        "run the endpoint picker (Envoy ext_proc gRPC server + HTTP admin)",
    ),
    "sim": ("epp_harness.sim.cli", "run one simulated vLLM-compatible model server"),
    "stack": ("epp_harness.stack", "run Envoy + EPP + simulated model servers locally (make run)"),
    "sidecar": ("epp.disagg.sidecar", "run the decode-side P/D proxy (coordinator: sidecar)"),
    "config": ("epp.serving.configcmd", "show the effective config, or list plugin types"),
    "top": ("epp.top.command", "a live terminal view of a running EPP (its /status and /metrics)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; only ``command``'s module is imported (keeps start-up fast and
    lets each subcommand depend only on what it uses)."""
    parser = argparse.ArgumentParser(
        prog="epp", description="Endpoint picker for LLM inference behind Envoy."
    )
    parser.add_argument("--version", action="version", version=f"epp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module, _parser=p)
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line; a usage error exits 2 with the usage of the command it
    is in (argparse leaves flags no subcommand knows to the top parser, which would
    show the top-level usage)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    args, unknown = build_parser(command).parse_known_args(argv)
    if unknown:
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        # flags alone are `epp serve`'s: the llm-d Router chart gives the image's
        # entry point (`epp`) its EPP's arguments, with no command
        argv = ["serve", *argv]
    args = parse(argv)
    setup_logging(level_of(args), format_of(args))
    result: int = args._module.run(args)
    return result
