"""`pw-serve --status`: what every island of a Ray cluster is doing, from any process.

    pw-serve --status --address 127.0.0.1:6379   # or --address auto

Connects to the Ray cluster, finds the island actors by name (`pw-island-*`
in the namespace `pathways`), and prints each island's report: its node, its
runs under way and what each waits for, the runs whose device work is not
over, and each client's objects and bytes. The gang scheduler's queue lives
in the process that owns the islands: `pw.status()` there shows it. Serving
the cluster as a long-running shared service (`pw-serve` without
`--status`) is not built yet. Errors are one line each; no traceback.
"""

from __future__ import annotations

import sys

import click

from .entry import run_command


class ServeError(Exception):
    """A problem reported on one line."""


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--status", "status", is_flag=True, help="Print what every island of the cluster is doing.")
@click.option("--address", default="auto", show_default=True, help="The Ray cluster: host:port or auto.")
def cli(status: bool, address: str) -> None:
    """Report on the islands of a Ray cluster (serving is not built yet)."""
    if not status:
        raise ServeError("only --status is available: a long-running shared service is not built yet")
    from pathways_mlir.runtime.ray_backend import cluster_status

    try:
        report = cluster_status(address)
    except ImportError:
        raise ServeError("pw-serve needs Ray: pip install 'pathways-mlir[ray]'") from None
    except ConnectionError as e:
        raise ServeError(f"cannot reach the Ray cluster at {address}: {e}") from None
    if not report["islands"]:
        raise ServeError(f"no island actors (pw-island-*) on the Ray cluster at {address}")
    click.echo(str(report))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pw-serve`; returns the exit status."""
    return run_command(cli, argv, "pw-serve", (ServeError,), lambda e: f"pw-serve: error: {e}")


if __name__ == "__main__":
    sys.exit(main())
