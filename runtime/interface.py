"""The interfaces the front end programs against: a cluster runtime and a client that runs programs on it.

Two implementations of each exist. In this process, `Runtime` is the
cluster and a `Client` of it runs programs. Attached to a service
(`pw.connect`), one `RemoteClient` is both: the connection is this process's
view of the cluster and its one client. `Compiled` (`frontend/compiled.py`)
uses only what is declared here, so a program runs the same on either, and
`tests/test_interface.py` checks that each implementation has every member
with the declared parameters.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from pathways_mlir.dialect.plan import ProgramPlan
from pathways_mlir.dialect.topology import Topology

from .dispatch_mode import DispatchMode


@runtime_checkable
class TopologySource(Protocol):
    """The cluster's topology and its version, which programs are lowered for."""

    @property
    def version(self) -> int: ...

    def snapshot(self) -> tuple[int, Topology]:
        """Returns (version, topology), read together."""


@runtime_checkable
class ClusterRuntime(Protocol):
    """A cluster programs are lowered for and loaded on."""

    resources: TopologySource

    def load(self, plan: ProgramPlan) -> Any:
        """Loads a plan (lowered for `resources`' current topology) so that it can run."""

    def object_count(self) -> int:
        """Counts the objects held for this process's clients."""

    def close(self) -> None:
        """Releases everything held for this process."""


@runtime_checkable
class ProgramClient(Protocol):
    """Runs programs on a cluster and owns their results (handles)."""

    @property
    def runtime(self) -> ClusterRuntime: ...

    def run(self, plan: ProgramPlan, args: Sequence, dispatch: DispatchMode | str = DispatchMode.PARALLEL,
            timeout: float | None = None) -> list:
        """Runs a loaded plan on `args`; returns one handle per program output."""

    def cancel(self, handle) -> bool:
        """Cancels the run of one of its handles; returns False if the run was already over."""

    def share(self, handle) -> Any:
        """Returns a read-only reference to one of its results, which other clients may read."""

    def close(self) -> None:
        """Releases everything it owns."""
