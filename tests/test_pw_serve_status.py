"""`pw-serve --status`: asks the local service by default, a Ray cluster only with `--address`, and is
bounded (`--timeout`, default 10 s) whoever it asks; `pw-serve --address` where no Ray cluster answers stops
at once. Real processes: a `pw-serve` (embedded backend, 2
islands of 2 CPU devices) found through the default service file, and a Ray address where nothing
listens. A busy service's report lists a few runs of each list and counts them all, and a reply the service
cannot send is one line: a service in the test's process (2 islands of 4 CPU devices), whose runtime the test
holds up. Every wait has a timeout; every process and service started here is stopped.
"""

import os
import socket
import subprocess
import sys

import pytest
from fetching import until
from test_admission_and_lifetimes import X, cross_island

from output_lines import read_line
from pathways_mlir.runtime.limits import Limits
from pathways_mlir.runtime.runtime import Runtime
from pathways_mlir.runtime.service import Service, open_connection
from pathways_mlir.runtime.status import LISTED

SERVE = [sys.executable, "-m", "pathways_mlir.cli.pw_serve"]
TIMEOUT = 120


def status(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVE, "--status", *args], capture_output=True, text=True, timeout=TIMEOUT, env=env)


def test_status_asks_the_service_of_the_default_service_file(tmp_path):
    env = {**os.environ, "PW_SERVICE_DIR": str(tmp_path / "service")}
    proc = subprocess.Popen([*SERVE, "--islands", "2", "--per-island", "2", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = read_line(proc, TIMEOUT, "pw-serve")
        assert line.startswith("pw-serve: serving 2 island(s)"), line
        result = status("--timeout", "60", env=env)      # generous on a loaded machine; the default is 10 s
        assert result.returncode == 0, result.stderr
        assert "island0" in result.stdout and "island1" in result.stdout
        # No bound, as a result's infinite timeout (it was an internal error: OverflowError for time_t).
        unbounded = status("--timeout", "inf", env=env)
        assert unbounded.returncode == 0 and "island1" in unbounded.stdout, unbounded.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


def test_status_without_a_service_says_so_on_one_line(tmp_path):
    result = status(env={**os.environ, "PW_SERVICE_DIR": str(tmp_path / "none")})
    assert result.returncode == 1
    assert result.stderr.startswith("pw-serve: error: no service is running here (no service file at ")
    assert len(result.stderr.splitlines()) == 1


def test_status_of_a_ray_address_where_nothing_answers_is_bounded():
    with socket.socket() as s:                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pytest.importorskip("ray")
    result = status("--address", f"127.0.0.1:{port}", "--timeout", "3")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("pw-serve: error: "), line


def test_serving_a_ray_address_where_nothing_answers_is_one_line(tmp_path):
    # Not --status: the service itself. It waited for Ray's retries of the address for many minutes, with
    # SIGINT and SIGTERM blocked (they wait for the service's sigwait); it checks the address answers first.
    with socket.socket() as s:                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pytest.importorskip("ray")
    result = subprocess.run([*SERVE, "--backend", "ray", "--address", f"127.0.0.1:{port}"], capture_output=True,
                            text=True, timeout=TIMEOUT, env={**os.environ, "PW_SERVICE_DIR": str(tmp_path / "s")})
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"pw-serve: error: no Ray cluster answers at 127.0.0.1:{port}: "
                                          f"Connection refused"]


def test_serving_a_ray_client_address_says_pw_needs_the_cluster_s_own(tmp_path):
    # A Ray Client address (ray://) was probed as a host named "ray://127.0.0.1": "Name or service not known".
    pytest.importorskip("ray")
    result = subprocess.run([*SERVE, "--backend", "ray", "--address", "ray://127.0.0.1:1"], capture_output=True,
                            text=True, timeout=TIMEOUT, env={**os.environ, "PW_SERVICE_DIR": str(tmp_path / "s")})
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("pw-serve: error: ray://127.0.0.1:1 is a Ray Client address, which pw does not use"), line


def test_status_of_an_ipv6_ray_address_probes_the_address_itself():
    # "[::1]:port" was probed as a host named "[::1]", brackets and all: "Name or service not known".
    pytest.importorskip("ray")
    result = status("--address", "[::1]:1", "--timeout", "30")
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("pw-serve: error: ") and "no Ray cluster answers at [::1]:1: " in line, line
    assert "not known" not in line, line


def test_status_of_a_malformed_ray_address_names_ray_s_error():
    pytest.importorskip("ray")
    result = status("--address", "1.2.3", "--timeout", "60")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "pw-serve: error: asking the Ray cluster at 1.2.3 failed: ValueError: Invalid address format: 1.2.3"]


def test_status_of_a_busy_service_lists_a_few_runs_of_each_list_and_counts_them_all(device_map, plan_builder,
                                                                                     tmp_path):
    """Every run was listed, about 300 bytes each in the reply's JSON header: with 30,000 runs in flight it
    passed the 8 MiB limit, and `pw-serve --status` and a client's own status failed. Here runs park on island1
    (island0 is closed, so it never sends) and more queue behind a held admission; the full report, a client's
    own and the printed one list `LISTED` runs of each list and count every run."""
    runtime = Runtime(device_map)
    (tmp_path / "service").mkdir(mode=0o700)
    service = Service(runtime, service_file=str(tmp_path / "service" / "service.json"))
    many = few = None
    try:
        plan, _ = cross_island(plan_builder, runtime.resources.topology)
        runtime.islands["island0"].close()
        many = open_connection(service.service_file, timeout=TIMEOUT)
        few = open_connection(service.service_file, timeout=TIMEOUT)
        for _ in range(LISTED + 5):
            many.run(plan, [X])
        until(lambda: runtime.status()["islands"]["island1"]["runs_count"] == LISTED + 5, "the runs parked", TIMEOUT)
        runtime.scheduler.hold()
        for _ in range(LISTED + 3):
            many.run(plan, [X])
        few.run(plan, [X])
        until(lambda: runtime.status()["scheduler"]["queued_count"] == LISTED + 4, "the runs queued", TIMEOUT)

        full = many.status(full=True)
        assert full["scheduler"]["queued_count"] == LISTED + 4 and len(full["scheduler"]["queued"]) == LISTED
        assert full["scheduler"]["admitted_count"] == LISTED + 5 and len(full["scheduler"]["admitted"]) == LISTED
        island1 = full["islands"]["island1"]
        assert island1["runs_count"] == LISTED + 5 and len(island1["runs"]) == LISTED
        own = few.status()                      # its own run only, listed and counted
        assert own["scheduler"]["queued_count"] == 1 and len(own["scheduler"]["queued"]) == 1
        assert own["islands"]["island1"]["runs_count"] == 0

        result = status("--service-file", service.service_file, "--timeout", "60")
        assert result.returncode == 0, result.stderr
        assert "  and 4 more queued run(s)" in result.stdout and "  and 5 more run(s) under way" in result.stdout
        assert f"island1: {LISTED + 5} run(s) under way" in result.stdout
        assert result.stdout.count(" waits for ") == 2 * LISTED        # the queue's and island1's, no more
    finally:
        runtime.close()          # fails the parked and queued runs
        for client in (many, few):
            if client is not None:
                client.close()
        service.close()


def test_a_status_reply_the_service_cannot_send_is_one_line(device_map, tmp_path):
    """An error the service sends back (here: its reply is over the header limit it was given) was printed as
    `pw-serve: internal error: RemoteError: ...` with exit status 2."""
    runtime = Runtime(device_map)
    (tmp_path / "service").mkdir(mode=0o700)
    service = Service(runtime, service_file=str(tmp_path / "service" / "service.json"),
                      limits=Limits(max_header_bytes=256))
    try:
        result = status("--service-file", service.service_file, "--timeout", "60")
        assert result.returncode == 1, result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"pw-serve: error: the service of {service.service_file} answered --status with an "
                               f"error: the reply cannot be sent: a header of "), line
        assert line.endswith(" bytes is over the endpoint's limit of 256"), line
    finally:
        service.close()
        runtime.close()


def test_status_is_answered_while_the_service_serves_its_limit_of_connections(device_map, tmp_path):
    """`pw-serve --status` was refused ("the service serves its limit of 1 connections; try later") exactly when
    the operator needs to see who holds the connections (found by a fault finder)."""
    runtime = Runtime(device_map)
    (tmp_path / "service").mkdir(mode=0o700)
    service = Service(runtime, service_file=str(tmp_path / "service" / "service.json"),
                      limits=Limits(max_connections=1))
    try:
        with open_connection(service.service_file, timeout=TIMEOUT):
            [held] = service.endpoint.status()["service"]["connections"]
            result = status("--service-file", service.service_file, "--timeout", "60")
            assert result.returncode == 0, result.stderr
            assert f"1 connected client(s) (ids {held})" in result.stdout, result.stdout
    finally:
        service.close()
        runtime.close()
