"""The private hyperframe patch in epp/extproc/h2frames.py stays pinned to what it
patches: each check below fails when h2 or hyperframe change the code it relies on
(then re-profile, and adapt or delete the patch)."""

from __future__ import annotations

import inspect

import h2.connection
import hyperframe.frame
from hyperframe.frame import DataFrame, Frame

from epp.extproc.h2frames import skip_hex_dumps_of_received_data


def test_h2_still_builds_the_repr_of_every_received_frame_eagerly() -> None:
    # the cost the patch removes; if h2 stops doing this, the patch is dead code
    source = inspect.getsource(h2.connection.H2Connection._receive_frame)
    assert 'logger.trace("Received frame: %s", repr(frame))' in source


def test_hyperframe_still_renders_a_frame_body_through_body_repr() -> None:
    assert "self._body_repr()" in inspect.getsource(Frame.__repr__)
    # DataFrame inherits the hex dump of its whole serialized body, which is patched
    assert "_body_repr" not in inspect.getsource(DataFrame)
    assert "hexlify" in inspect.getsource(hyperframe.frame._raw_data_repr)


def test_after_the_patch_a_data_frame_shows_its_size() -> None:
    skip_hex_dumps_of_received_data()
    frame = DataFrame(stream_id=1, data=b"x" * 16384)
    assert repr(frame).endswith(": <16384 bytes>")
