"""Another checkout's CLI: the flags it lacks are left out, with their values, as read
from its own ``--help`` (a stand-in checkout whose ``epp`` prints one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.eppfrom import OtherCheckout

HELP = """
import sys
print("usage: epp serve [-h] [--grpc-port GRPC_PORT] [--workers N] [--no-uvloop]")
print("  --ready-file READY_FILE   write ports here")
"""


def test_flags_the_other_cli_lacks_are_left_out_with_their_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "epp").mkdir()
    (tmp_path / "epp" / "__init__.py").write_text("")
    (tmp_path / "epp" / "__main__.py").write_text(HELP)
    other = OtherCheckout(tmp_path)
    argv = [
        "serve", "--grpc-port", "0", "--stream-chunk-timeout", "4", "--no-uvloop",
        "--tls-self-signed", "--workers=2", "--peer-load-bind=ipc://x", "--ready-file", "r",
    ]  # fmt: skip
    assert other.adapt(argv) == [
        "serve", "--grpc-port", "0", "--no-uvloop", "--workers=2", "--ready-file", "r",
    ]  # fmt: skip
    said = capsys.readouterr().err
    assert "--stream-chunk-timeout" in said and "--tls-self-signed" in said
    other.adapt(argv)
    assert capsys.readouterr().err == ""  # said once
