"""`pw-serve`: a shared service that other processes attach to, and reports on what it is doing.

    pw-serve                                        # serve 2 islands x 4 CPU devices on a Unix socket
    pw-serve --islands 2 --per-island 2 --port 0    # another shape; also TCP 127.0.0.1, any free port
    pw-serve --backend ray --address HOST:6379      # own the islands on an existing Ray cluster
    pw-serve --status                               # ask the local service (the default service file)
    pw-serve --status --service-file PATH           # ask another service for its full report
    pw-serve --status --address 127.0.0.1:6379      # the islands of a Ray cluster (or --address auto)

Serving (`runtime/service.py`): one `Runtime` and an `Endpoint` on a Unix
socket beside the service file (and on TCP 127.0.0.1 with `--port`), found
through the service file (socket, key path, pid; host and port with TCP;
default `$PW_SERVICE_DIR/service.json`, else
`~/.cache/pathways-mlir/service.json`) that `pw.connect()` reads. It prints
one line saying where it listens, runs until SIGINT or SIGTERM (blocked
before any thread starts, so the main thread's `sigwait` takes them),
then stops in order: the runtime (runs still queued fail), the endpoint
(every connection dropped, their objects released), and its files (service
file, socket, key), and exits 0. `--idle-timeout`, `--max-connections` and
`--max-header-bytes` set the endpoint's limits (`runtime/wire.py`).

`--status` asks the service of the service file (`--service-file`, else the
default one) over its Unix socket, for the full report its owner may see: the scheduler's queue and what each queued
run waits for, each island's runs and what each waits for, each client's
objects and bytes, the bytes reserved per device, and the connected
clients; each list of runs shows at most 20 of them and counts the rest
(`runtime/status.py`, `LISTED`), also while the service serves its `--max-connections`
(`max_status_connections` such at once). `--status --address` asks a Ray cluster instead ("auto" or
host:port): it finds the island actors by name (`pw-island-*` in the
namespace `pathways`) and prints each island's report; the scheduler's
queue lives in the process that owns those islands. Either is bounded at
`--timeout` seconds (default `STATUS_TIMEOUT`) and stops on Ctrl-C: the Ray question runs in a
child process, killed then (connecting to Ray can retry a cluster's GCS
for minutes, deaf to signals). Errors are one line each, a service's refusal of the
request too; no traceback.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import click

from pathways_mlir.runtime.cluster import CLUSTER_ENV, MAX_HOST_DEVICES, ClusterError, prepare_host_devices

from pathways_mlir.runtime.limits import Limits
from pathways_mlir.runtime.policies import POLICIES

from .entry import run_command


STATUS_TIMEOUT = 10.0     # seconds `--status` may take, whoever it asks

# The child process that asks a Ray cluster (argv[1]: its address) and prints its islands' report.
_RAY_STATUS = """
import sys
from pathways_mlir.runtime.ray_backend import cluster_status
try:
    report = cluster_status(sys.argv[1], float(sys.argv[2]))
except ConnectionError as e:
    sys.exit(f"cannot reach the Ray cluster at {sys.argv[1]}: {e}")
except Exception as e:  # noqa: BLE001  (Ray's own errors, such as a malformed address: one line)
    sys.exit(f"asking the Ray cluster at {sys.argv[1]} failed: {type(e).__name__}: {e}")
if not report["islands"]:
    sys.exit(f"no island actors (pw-island-*) on the Ray cluster at {sys.argv[1]}")
print(report)
"""


_REPORT_SLACK = 1.0   # seconds of --timeout left for the Ray question's child to print its report and exit


class ServeError(Exception):
    """A problem reported on one line."""


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--status", "status", is_flag=True,
              help="Print what the local service (or, with --address, a Ray cluster's islands) is doing.")
@click.option("--service-file", default=None, type=click.Path(dir_okay=False),
              help="The service file to write (serving) or read (--status). [default: "
                   "$PW_SERVICE_DIR/service.json, else ~/.cache/pathways-mlir/service.json]")
@click.option("--address", default=None, help="The Ray cluster, host:port or auto: the islands' home with "
                                                "--backend ray; asked by --status --address.")
@click.option("--backend", type=click.Choice(["embedded", "ray"]), default="embedded", show_default=True,
              help="Run the islands in the service's process, or each in a Ray actor.")
@click.option("--islands", type=click.IntRange(min=1), default=None, help=f"Islands (default from {CLUSTER_ENV}).")
@click.option("--per-island", type=click.IntRange(min=1), default=None, help="CPU devices per island.")
@click.option("--device-memory-bytes", type=click.IntRange(min=1), default=None,
              help="Each device's memory for admission (default: the device's).")
@click.option("--policy", type=click.Choice(POLICIES), default="fifo", show_default=True,
              help="The gang scheduler's policy (a run's timeout= is its deadline under 'deadline').")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Also serve on TCP 127.0.0.1:PORT (0: any free port). [default: the Unix socket only]")
@click.option("--idle-timeout", type=click.FloatRange(min=0, min_open=True), default=Limits.idle_timeout,
              show_default=True, help="Seconds a connection may stay silent before it is dropped.")
@click.option("--max-connections", type=click.IntRange(min=1), default=Limits.max_connections,
              show_default=True, help="Connections served at once.")
@click.option("--max-header-bytes", type=click.IntRange(min=1), default=Limits.max_header_bytes,
              show_default=True, help="The largest JSON header of a request.")
@click.option("--max-plan-bytes", type=click.IntRange(min=1), default=Limits.max_plan_bytes,
              show_default=True, help="The plans one connection holds together (their JSON and compiled functions).")
@click.option("--max-objects", type=click.IntRange(min=1), default=Limits.max_objects, show_default=True,
              help="The results one connection holds.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=STATUS_TIMEOUT, show_default=True,
              help="Seconds --status may take.")
def cli(status, service_file, address, backend, islands, per_island, device_memory_bytes, policy, port,
        idle_timeout, max_connections, max_header_bytes, max_plan_bytes, max_objects, timeout) -> None:
    """Serve a cluster to other processes (pw.connect), or report on one (--status)."""
    if status:
        _status(service_file, address, timeout)
        return
    if (islands is None) != (per_island is None):
        raise ServeError("--islands and --per-island go together")
    if backend == "embedded" and islands is not None and islands * per_island > MAX_HOST_DEVICES:
        raise ServeError(f"--islands {islands} --per-island {per_island} is {islands * per_island} CPU devices; "
                         f"an embedded cluster has at most {MAX_HOST_DEVICES}")
    if address is not None and backend != "ray":
        raise ServeError("--address names a Ray cluster to own islands on: it needs --backend ray")
    # Before anything starts a thread (importing JAX does): SIGINT and SIGTERM wait for the main thread's
    # sigwait, in every thread, so a signal always stops the service in order.
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    if islands is not None:
        os.environ[CLUSTER_ENV] = f"{islands}x{per_island}"
    prepare_host_devices()            # before JAX starts: the embedded islands' CPU devices
    from pathways_mlir.runtime.executables import keep_64_bit_values
    from pathways_mlir.runtime.runtime import Runtime
    from pathways_mlir.runtime.service import Service, ServiceError

    keep_64_bit_values()

    try:
        limits = Limits(idle_timeout=idle_timeout, max_connections=max_connections, max_header_bytes=max_header_bytes,
                        max_plan_bytes=max_plan_bytes, max_objects=max_objects)
    except ValueError as e:          # nan and inf pass click's FloatRange
        raise ServeError(str(e)) from None
    try:
        runtime = Runtime(policy=policy, backend=backend, address=address, islands=islands, per_island=per_island,
                          device_memory_bytes=device_memory_bytes)
    except ImportError:
        raise ServeError("--backend ray needs Ray: pip install 'pathways-mlir[ray]'") from None
    except (ValueError, ConnectionError, ClusterError) as e:
        raise ServeError(str(e)) from None
    try:
        service = Service(runtime, port, service_file, limits)
    except ServiceError as e:
        runtime.close()
        raise ServeError(str(e)) from None
    try:
        shape = ", ".join(f"{i.name}: {i.num_devices} devices" for i in runtime.resources.topology.islands)
        click.echo(f"pw-serve: serving {len(runtime.islands)} island(s) ({shape}, {backend} backend) on "
                   f"{service.address}; service file {service.service_file}")
        sys.stdout.flush()
        received = signal.sigwait(stop)
        click.echo(f"pw-serve: {signal.Signals(received).name}: stopping")
    finally:
        runtime.close()      # first: runs still queued or parked fail, so no connection waits for them
        service.close()      # drops every connection, removes the service file and the key
    # Stopped in order. A computation may still run in XLA's own threads (it cannot be interrupted), and
    # the interpreter's exit would abort under it (SIGABRT): leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _status(service_file: str | None, address: str | None, timeout: float) -> None:
    """Prints the report of the service of `service_file` (default: the default service file), or of the
    island actors of the Ray cluster at `address`; at most `timeout` seconds, Ctrl-C stops it."""
    if service_file is not None and address is not None:
        raise ServeError("--status asks a service (--service-file) or a Ray cluster (--address), not both")
    try:
        click.echo(_ray_status(address, timeout) if address is not None else _service_status(service_file, timeout))
    except KeyboardInterrupt:
        raise ServeError("--status: interrupted") from None


def _service_status(service_file: str | None, timeout: float) -> str:
    from pathways_mlir.runtime.remote_client import RemoteError
    from pathways_mlir.runtime.service import ServiceError, default_service_file, open_connection

    path = service_file or default_service_file()
    if service_file is None and not os.path.exists(path):
        raise ServeError(f"no service is running here (no service file at {path}): start one with pw-serve, "
                         f"or ask a Ray cluster with --status --address")
    try:
        with open_connection(path, timeout=timeout, status_only=True) as client:   # also when the service is full
            return str(client.status(full=True))
    except ServiceError as e:
        raise ServeError(str(e)) from None
    except TimeoutError:
        raise ServeError(f"the service of {path} did not answer within {timeout:g} s") from None
    except RemoteError as e:         # the service refused the request, or could not send its reply
        raise ServeError(f"the service of {path} answered --status with an error: {e}") from None


def _ray_status(address: str, timeout: float) -> str:
    if importlib.util.find_spec("ray") is None:
        raise ServeError("pw-serve needs Ray: pip install 'pathways-mlir[ray]'")
    deadline = time.time() + timeout - _REPORT_SLACK     # the islands' answers, then the report's printing
    child = subprocess.Popen([sys.executable, "-c", _RAY_STATUS, address, repr(deadline)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ServeError(f"the Ray cluster at {address} did not answer within {timeout:g} s") from None
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)      # the child and the Ray processes it may have started
            child.wait()
    if child.returncode != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        raise ServeError(lines[-1] if lines else f"asking the Ray cluster at {address} failed "
                                                 f"(exit status {child.returncode})")
    return out.rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-serve`; returns the exit status."""
    return run_command(cli, argv, "pw-serve", (ServeError, ClusterError), lambda e: f"pw-serve: error: {e}")


if __name__ == "__main__":
    sys.exit(main())
