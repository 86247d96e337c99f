"""Many ``epp`` command lines that end during start-up (usage errors, bad files), each
in a process of its own, for the price of one import of the CLI.

Starting ``python -m epp serve`` costs about a second of CPU before the first flag is
checked (importing the server), which a file of thirty usage-error cases pays thirty
times. Here one interpreter imports the CLI once and forks a child per command line:
each child runs ``epp``'s own ``main`` with its own exit code, stdout and stderr, as
the console script would. Only for command lines that exit before serving: one that
starts a server would wait until the timeout."""

from __future__ import annotations

import json
import subprocess
import sys

# The driver: imports the CLI and the server, then forks one child per command line,
# its stdout and stderr in files of their own. Nothing in it starts a thread or a gRPC
# channel before the forks.
_DRIVER = r"""
import json, os, sys, tempfile
from epp.cli import build_parser, main

build_parser("serve")  # imports the server's modules once, before any fork
results = []
for argv in json.load(sys.stdin):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.argv = ["epp", *argv]
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 70
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        texts = [f.read().decode(errors="replace") for f in (out, err)]
        results.append([os.waitstatus_to_exitcode(status), *texts])
json.dump(results, sys.__stdout__)
"""


def run_epp_many(
    argvs: list[list[str]], timeout: float = 120.0
) -> list[subprocess.CompletedProcess[str]]:
    """``epp ARGV`` for each of ``argvs`` (each a child process; see the module's doc), in
    order: their exit codes, stdout and stderr."""
    driver = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert driver.returncode == 0, driver.stderr
    return [
        subprocess.CompletedProcess(["epp", *argv], code, out, err)
        for argv, (code, out, err) in zip(argvs, json.loads(driver.stdout), strict=True)
    ]
