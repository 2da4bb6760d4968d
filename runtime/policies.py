"""The gang scheduler's policies: their names, their windows, and the check of a name.

Kept apart from `scheduler.py` (which imports JAX through the islands) so that `pw-serve` and
`pw.configure` check a policy before anything starts; how each policy orders queued runs is in
`scheduler.py` (`GangScheduler._heads`).

- `fifo`: arrival order; every run that fits is admitted at once.
- `share`: start-time fair queueing on device time, by client weight.
- `sjf`: shortest estimated device time first.
- `deadline`: earliest deadline first (a run's deadline is its `timeout=`; runs without one go after
  those with one, in arrival order).

Every policy but `fifo` admits at most `window` runs onto the devices at a time (the runs queued
beyond it are the ones the policy orders); `WINDOWS` gives each one's default.
"""

from __future__ import annotations

POLICIES = ("fifo", "share", "sjf", "deadline")
# Admitted runs that may be on the devices at once, by policy (None: no window). Two keeps an island's
# executor fed (one run executing, the next queued behind it) while a short run waits for at most those.
WINDOWS = {"fifo": None, "share": 4, "sjf": 2, "deadline": 2}


def check_policy(policy: str, window: int | None = None) -> None:
    """Raises ValueError in one line unless `policy` names a policy and `window` (if given) is a positive
    integer."""
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r} (choose from {', '.join(POLICIES)})")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window= must be a positive integer (admitted runs on the devices), not {window!r}")
