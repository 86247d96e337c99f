"""A CPU fix for h2, the HTTP/2 library under grpclib (kept apart from the transport so
it can be tested without loading grpclib's generated health module)."""

from __future__ import annotations

from hyperframe.frame import DataFrame


def skip_hex_dumps_of_received_data() -> None:
    """h2 traces every received frame with an eagerly built ``repr(frame)``, and
    hyperframe's DataFrame repr hex-encodes the whole payload before cutting it to 20
    characters: ~20 µs per 16 KB frame, built and thrown away (the trace logger is a
    no-op). With long prompts that is ~10 % of the EPP's CPU per request (profiled with
    a 220 KB body). The repr keeps the frame's size instead; affects only debug output."""
    DataFrame._body_repr = _data_frame_body_repr  # type: ignore[method-assign,assignment]


def _data_frame_body_repr(frame: DataFrame) -> str:
    return f"<{len(frame.data)} bytes>"
