"""The gRPC port's TLS material: never shown, and loaded without touching the disk."""

from __future__ import annotations

import ssl
import tempfile

import pytest

from epp.extproc import tls


def test_the_private_key_never_shows_in_a_repr() -> None:
    material = tls.self_signed()
    assert b"PRIVATE KEY" in material.key_pem
    assert "PRIVATE KEY" not in repr(material)
    assert "self-signed" in repr(material)


def test_the_server_context_needs_no_writable_temp_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only root filesystem (a common hardening) leaves no temp dir: the key
    goes to OpenSSL through an in-memory file instead."""
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/epp-no-tmp")
    context = tls.server_context(tls.self_signed())
    assert isinstance(context, ssl.SSLContext)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
