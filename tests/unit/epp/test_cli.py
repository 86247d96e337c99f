"""The entry point's parsing: a usage error names the subcommand it is in, and URLs
given without a scheme are http://."""

from __future__ import annotations

import pytest

from epp import cli


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["top"], ["config", "show"], ["sidecar", "--decode", "127.0.0.1:1"], ["serve"], ["stack"]],
    ids=lambda argv: argv[0],
)
def test_an_unknown_flag_shows_the_subcommand_s_usage(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    err = usage_error(capsys, *argv, "--no-such-flag", "x")
    assert err.startswith(f"usage: epp {argv[0]} [-h]")
    assert f"epp {argv[0]}: error: unrecognized arguments: --no-such-flag x" in err


def test_flags_alone_are_serve_s(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "--no-such-flag")
    assert err.startswith("usage: epp serve [-h]")


def test_an_unknown_command_shows_the_top_level_usage(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "serf")
    assert err.startswith("usage: epp [-h] [--version] COMMAND")
    assert "invalid choice: 'serf'" in err


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:9090", "http://127.0.0.1:9090"),
        ("epp.example:9090/", "http://epp.example:9090"),
        ("[::1]:9090", "http://[::1]:9090"),
        ("https://epp:9443", "https://epp:9443"),
        ("http://127.0.0.1:9090", "http://127.0.0.1:9090"),
    ],
)
def test_top_url_defaults_to_http(given: str, url: str) -> None:
    assert cli.parse(["top", "--url", given]).url == url


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("ftp://epp:9090", "'ftp://epp:9090': use http:// or https://, not ftp://"),
        ("http://:9090", "'http://:9090': no host"),
        ("epp:90x", "'epp:90x': the port is not a number 0-65535"),
    ],
)
def test_a_bad_top_url_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], given: str, message: str
) -> None:
    err = usage_error(capsys, "top", "--url", given)
    assert f"epp top: error: argument --url: {message}" in err
