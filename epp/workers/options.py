"""The flags of ``epp serve --workers N`` and the ports they give each worker."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from epp.common import argtypes

DEFAULT_WORKERS = 1
DEFAULT_BASE_PORT = 9100  # workers 1..N-1 listen on 9100, 9101, ...


@dataclass(frozen=True)
class WorkerOptions:
    count: int = DEFAULT_WORKERS
    base_port: int = DEFAULT_BASE_PORT
    # workers 1..N-1's ports, in order (--worker-ports): overrides base_port
    listed: tuple[int, ...] = ()
    # set in a worker process only (by its parent): the parent's socket and its index
    link: Path | None = None
    index: int = 0

    @property
    def parent(self) -> bool:
        """This process starts workers (it runs no ext_proc port of its own)."""
        return self.count > 1 and self.link is None

    def ports(self, grpc_port: int) -> list[int]:
        """Each worker's ext_proc port: worker 0 on ``grpc_port``, worker i on
        ``base_port + i - 1`` (0: any free port, also for every worker when
        ``grpc_port`` is 0), or worker i on the i-th ``listed`` port if ports are listed."""
        if self.listed:
            return [grpc_port, *self.listed]
        if grpc_port == 0 or self.base_port == 0:
            return [grpc_port, *([0] * (self.count - 1))]
        return [grpc_port, *(self.base_port + i for i in range(self.count - 1))]

    def check(self, grpc_port: int, others: dict[str, int | None]) -> None:
        """ValueError if a worker's port is another port of the EPP's (``others``:
        flag -> port)."""
        if not self.parent:
            return
        if self.listed and len(self.listed) != self.count - 1:
            raise ValueError(
                f"--worker-ports lists {len(self.listed)} distinct ports; --workers {self.count} "
                f"needs {self.count - 1} (workers 1 to {self.count - 1})"
            )
        extra = self.ports(grpc_port)[1:]
        for flag, port in others.items():
            if port and port in extra:
                raise ValueError(
                    f"{self._flag} with --workers {self.count} puts a worker on port {port}, "
                    f"which {flag} uses; pick ports clear of it"
                )
        if grpc_port and grpc_port in extra:
            raise ValueError(
                f"{self._flag} with --workers {self.count} puts a worker on --grpc-port {grpc_port}"
            )

    @property
    def _flag(self) -> str:
        """The flag that placed workers 1..N-1, as given."""
        if self.listed:
            return "--worker-ports " + ",".join(map(str, self.listed))
        return f"--worker-base-port {self.base_port}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=argtypes.positive_int,
        default=DEFAULT_WORKERS,
        help="ext_proc worker processes; more than 1 starts a parent process that keeps "
        "discovery, the HTTP port and the scrapes, and N workers each on an ext_proc port "
        "of its own (docs/workers.md)",
    )
    parser.add_argument(
        "--worker-base-port",
        type=argtypes.port,
        default=DEFAULT_BASE_PORT,
        help="ext_proc port of worker 1 (worker i: this + i - 1; worker 0 is on --grpc-port); "
        "0 = any free ports",
    )
    parser.add_argument(
        "--worker-ports",
        type=argtypes.comma_ports,
        metavar="PORT[,PORT...]",
        help="ext_proc ports of workers 1, 2, ... in order, one per worker after worker 0 "
        "(instead of --worker-base-port; e.g. to start an EPP again on the ports it had)",
    )
    # given by the parent to its workers, never by hand
    parser.add_argument("--worker-link", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)


def from_args(args: argparse.Namespace) -> WorkerOptions:
    return WorkerOptions(
        args.workers,
        args.worker_base_port,
        args.worker_ports or (),
        args.worker_link,
        args.worker_index,
    )
