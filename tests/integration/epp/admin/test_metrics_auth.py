"""`epp serve --metrics-endpoint-auth`: /metrics answers only bearer tokens of
identities the Kubernetes API (here the fake one) says may get it; the other paths of
the HTTP port stay as they were."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from epp_harness.procs import ManagedProcess, start_epp
from tests.support.http import request
from tests.support.kube_server import FakeKubeThread, write_kubeconfig


@pytest.fixture
def kube() -> Iterator[FakeKubeThread]:
    with FakeKubeThread().running() as k:
        k.fake.tokens.update({"reader-token": "system:serviceaccount:mon:prometheus",
                              "other-token": "system:serviceaccount:default:app"})  # fmt: skip
        k.fake.metrics_readers.add("system:serviceaccount:mon:prometheus")
        yield k


@pytest.fixture
def epp(kube: FakeKubeThread, tmp_path: Path, closed_addresses: list[str]) -> Iterator[str]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    proc: ManagedProcess = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--endpoint", closed_addresses[0],
        "--metrics-endpoint-auth", "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{proc.info['http_port']}"
    finally:
        proc.stop()


def get(url: str, token: str | None = None) -> tuple[int, dict[str, object] | bytes]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    status, _, body = request(url, headers=headers)
    return status, (orjson.loads(body) if status != 200 else body)


def test_only_allowed_identities_read_metrics(epp: str, kube: FakeKubeThread) -> None:
    status, body = get(f"{epp}/metrics")
    assert status == 401 and body["error"]["code"] == "missing_bearer_token"  # type: ignore[index]
    status, body = get(f"{epp}/metrics", "forged")
    assert status == 401 and body["error"]["code"] == "invalid_token"  # type: ignore[index]
    status, body = get(f"{epp}/metrics", "other-token")
    assert status == 403 and body["error"]["code"] == "forbidden"  # type: ignore[index]
    status, body = get(f"{epp}/metrics", "reader-token")
    assert status == 200 and b"epp_endpoints" in body  # type: ignore[operator]
    # answers are cached: a second scrape asks the API server nothing
    reviews = len(kube.call(lambda: kube.fake.seen("tokenreviews")))
    assert get(f"{epp}/metrics", "reader-token")[0] == 200
    assert len(kube.call(lambda: kube.fake.seen("tokenreviews"))) == reviews
    assert get(f"{epp}/health")[0] == 200  # probes need no token


def test_an_unreachable_api_server_is_503(tmp_path: Path, closed_addresses: list[str]) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://{closed_addresses[1]}")
    proc = start_epp(
        tmp_path, "epp", "serve", "--grpc-port", "0", "--http-port", "0",
        "--grpc-health-port", "0", "--endpoint", closed_addresses[0],
        "--metrics-endpoint-auth=true", "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    try:
        status, body = get(f"http://127.0.0.1:{proc.info['http_port']}/metrics", "t")
    finally:
        proc.stop()
    assert status == 503 and body["error"]["code"] == "auth_unavailable"  # type: ignore[index]
