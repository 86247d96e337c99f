import pytest

from epp.workers.options import WorkerOptions


def test_worker_zero_keeps_the_grpc_port_and_the_others_take_the_range() -> None:
    assert WorkerOptions(3, 9100).ports(9002) == [9002, 9100, 9101]
    assert WorkerOptions(3, 0).ports(9002) == [9002, 0, 0]
    assert WorkerOptions(2, 9100).ports(0) == [0, 0]
    assert WorkerOptions(1).ports(9002) == [9002]


def test_a_range_over_another_port_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--grpc-health-port"):
        WorkerOptions(3, 9002).check(9001, {"--grpc-health-port": 9003, "--http-port": 9090})
    with pytest.raises(ValueError, match="--grpc-port 9100"):
        WorkerOptions(2, 9100).check(9100, {})
    WorkerOptions(4, 9100).check(9002, {"--grpc-health-port": 9003, "--http-port": 9090})
    WorkerOptions(1, 9003).check(9002, {"--grpc-health-port": 9003})  # one worker: no range


def test_listed_ports_place_the_workers_one_each_and_must_match_the_count() -> None:
    assert WorkerOptions(3, 9100, (7001, 7005)).ports(9002) == [9002, 7001, 7005]
    assert WorkerOptions(3, 0, (7001, 7005)).ports(0) == [0, 7001, 7005]
    with pytest.raises(ValueError, match="lists 1 distinct ports; --workers 3 needs 2"):
        WorkerOptions(3, 9100, (7001,)).check(9002, {})
    with pytest.raises(ValueError, match="--worker-ports 7001,9090 with --workers 3"):
        WorkerOptions(3, 9100, (7001, 9090)).check(9002, {"--http-port": 9090})
    WorkerOptions(3, 9100, (7001, 7005)).check(9002, {"--http-port": 9090})
