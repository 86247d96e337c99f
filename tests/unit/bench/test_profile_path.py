"""bench.profile_path's pure parts: which part of the request path a sample or a
function's own time goes to."""

from __future__ import annotations

import pytest

from bench.profile_path import part, sampled_part, sampled_shares

ROOT = [("libc.so.6", "0x7f221f04524a"), ("asyncio/runners.py", "Runner.run")]


def test_a_sample_goes_to_its_innermost_frame_that_names_a_part() -> None:
    send = ("epp/extproc/native/grpc.py", "Call.send")
    assert sampled_part([*ROOT, send]) == "transport"
    assert sampled_part([*ROOT, send, ("message.c", "upb_Encode")]) == "protobuf"
    # libc and the interpreter count for the code around them
    assert sampled_part([*ROOT, send, ("libc.so.6", "memcpy")]) == "transport"
    write = [("loop.c", "uv__try_write"), ("libc.so.6", "send")]
    assert sampled_part([*ROOT, send, *write]) == "event loop"
    on_message = ("epp/extproc/stream.py", "ExtProcStream.on_message")
    assert sampled_part([*ROOT, on_message]) == "state machine"
    assert sampled_part([("libc.so.6", "0x1")]) == "other"


def test_raw_profiles_are_counted_per_part() -> None:
    raw = (
        "main (epp/scheduling/scheduler.py:10);pick (epp/scheduling/profile.py:3) 3\n"
        "main (epp/extproc/native/connection.py:5) 1\n"
    )
    shares = sampled_shares(raw)
    assert shares["scheduling"] == pytest.approx(0.75)
    assert shares["transport"] == pytest.approx(0.25)


def test_functions_go_to_their_files_part_and_c_functions_by_name() -> None:
    assert part(("/x/epp/scheduling/latency.py", 1, "predict")) == "latency model"
    assert part(("/x/epp/observability/metrics.py", 1, "inc")) == "metrics"
    assert part(("~", 0, "<method 'SerializeToString' of 'Message' objects>")) == "protobuf"
    assert part(("~", 0, "<built-in method builtins.len>")) is None  # its caller's
