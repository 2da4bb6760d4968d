"""`pw-serve --status`: asks the local service by default, a Ray cluster only with `--address`, and is
bounded (`--timeout`, default 10 s) whoever it asks; `pw-serve --address` where no Ray cluster answers stops
at once. Real processes: a `pw-serve` (embedded backend, 2
islands of 2 CPU devices) found through the default service file, and a Ray address where nothing
listens. Every wait has a timeout; every process started here is stopped.
"""

import os
import socket
import subprocess
import sys

import pytest

from output_lines import read_line

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


def test_status_of_a_malformed_ray_address_names_ray_s_error():
    pytest.importorskip("ray")
    result = status("--address", "1.2.3", "--timeout", "60")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "pw-serve: error: asking the Ray cluster at 1.2.3 failed: ValueError: Invalid address format: 1.2.3"]
