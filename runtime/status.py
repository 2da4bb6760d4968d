"""One place to see it all: what is queued, and what every waiting run waits for.

`Runtime.status()` (and `pathways_mlir.status()` for the default runtime)
gathers, as plain data that travels through Ray:

- the gang scheduler: the runs queued for admission, each with what it
  waits for (memory, naming the device, the bytes it needs and what is
  reserved; an earlier run; its client's turn; a held admission), and the
  admitted runs still on the devices;
- every island: the runs under way there, each with what it waits for (a
  recv names the value by buffer, the peer's send step and the step that
  produced it), the runs whose device work is not over, what it is busy
  with and for how long, whether it is wedged, and each client's objects
  and bytes; an island that does not answer says why;
- every client, summed over the islands: its objects and bytes;
- the bytes the scheduler reserves on every device (runs admitted, results held);
- the plans compiling (`Runtime.load`: a program's first run waits for it), each with its program and for
  how long;
- served by `pw-serve` (`runtime/service.py`): the service's address and the
  clients connected to it.

Every list of runs is bounded, so that the report stays small and quick when the service is busiest (30,000
runs in flight listed one by one took 9 MB, over a reply's 8 MiB header): the scheduler's queue, its admitted
runs, and each island's runs and runs with device work list at most `LISTED` runs each, oldest first (the queue
lists every client's oldest run before any client's second, so that a client with many runs queued hides no
other's), and beside each list its count says how many there are in all (`queued_count`, `admitted_count`,
`runs_count`, `device_work_count`); the text says "and N more". Asked for one client's view
(`Runtime.status(client)`, a service's client), the runs listed and counted are that client's.

`str()` of a `Status` is the same report as text.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Iterable

from .admission import MemoryLedger, Need, result_need

if TYPE_CHECKING:
    from .run import Run

# Runs each list of a report shows at most (the queue, an island's runs, run ids); the rest are counted. A run listed
# is about 300 bytes of JSON, so a report stays near 6 KB per island whatever runs, far below a reply's 8 MiB header.
LISTED = 20


def first_listed(items: Iterable) -> list:
    """The first `LISTED` of `items` (what a report lists of them)."""
    return list(itertools.islice(items, LISTED))


def shortfall(ledger: MemoryLedger, need: Need) -> str | None:
    """Names the first device where `need` does not fit now, or None if it fits everywhere."""
    short = ledger.first_short(need)
    if short is None:
        return None
    island, device, nbytes, used = short
    return f"memory: {nbytes} bytes on device {device} of {island}, which has {used} of " \
           f"{ledger.capacity[island]} bytes reserved"


def held_by_handles(ledger: MemoryLedger, run: Run, in_flight: Iterable[Run],
                    held_results: dict[tuple[int, int], tuple[int, Need]], gone: set[int],
                    unshared: set[tuple[int, int]], admitting: Run | None = None) -> str | None:
    """Says why `run` cannot fit even once every run `in_flight` is over (what blocks it is held by live
    handles: `held_results`, (run id, buffer) -> (client, need), but for the `unshared` ones, shared objects
    released while runs read them, whose bytes come back once those are over; and the results of runs in
    flight whose clients are not `gone`, but for a cond's branch run's: its cond's thread releases them before
    the parent is over), or None if it could then. With `admitting`, a run not admitted yet, counts it as in
    flight too (the results donated to it as its own): whether admitting it would leave `run` never fitting."""
    floor = ledger.copy()
    holders: dict[tuple[str, int], dict[int, list[int]]] = {}
    taken_over = set(run.donations)            # results whose bytes a run takes over
    if admitting is not None:
        floor.take(admitting.need)               # (given back below, as every run in flight's)
        in_flight = itertools.chain(in_flight, (admitting,))
        taken_over.update(admitting.donations)
    for other in in_flight:
        floor.give(other.need)
        if other.parent is not None:
            continue
        for buffer in other.plan.distinct_outputs:
            if buffer not in other.released and other.error is None and other.client_id not in gone:
                need = result_need(other.plan, buffer)
                floor.take(need)
                _count(holders, other.client_id, need)
    for key, (client, need) in held_results.items():
        if key in taken_over or key in unshared:
            floor.give(need)                    # a run takes these bytes over, or their readers give them back
        else:
            _count(holders, client, need)
    where = floor.first_short(run.need)
    if where is None:
        return None
    island, device, nbytes, used = where
    held = holders.get((island, device), {})
    who = "; ".join(f"client {c} holds {n} object(s), {b} bytes" for c, (n, b) in sorted(held.items())) or \
        "nothing is held by handles"
    return (f"program {run.plan.program} needs {nbytes} bytes on device {device} of {island}, which has "
            f"{floor.capacity[island]} bytes, {used} of them held by live handles that nothing in flight "
            f"will free ({who}): release results (handle.delete()) or use less memory")


def _count(holders: dict, client: int, need: dict) -> None:
    """Adds one object of `client` with `need` to the holders of each device it covers."""
    for island, ranges in need.items():
        for begin, end, nbytes in ranges:
            for device in range(begin, end):
                entry = holders.setdefault((island, device), {}).setdefault(client, [0, 0])
                entry[0] += 1
                entry[1] += nbytes


def unreachable(error: BaseException) -> dict:
    """An island's report when it did not answer, or was lost."""
    return {"unreachable": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}


class Status(dict):
    """A runtime's status (see the module docstring); prints as a report."""

    def __str__(self) -> str:
        scheduler = self["scheduler"]
        if scheduler is None:
            lines = ["scheduler: in the process that owns the islands (pw.status() there)"]
        else:
            admitted = scheduler["admitted"]
            lines = [f"scheduler ({scheduler['policy']}): admitted runs on the devices: "
                     f"{admitted or 'none'}{_more(scheduler['admitted_count'], admitted)}"]
            lines += [f"  queued run {q['run']} ({q['program']}, client {q['client']}) waits for {q['waits_for']}"
                      for q in scheduler["queued"]]
            if scheduler["queued_count"] > len(scheduler["queued"]):
                lines.append(f"  and {scheduler['queued_count'] - len(scheduler['queued'])} more queued run(s)")
        for name, island in self["islands"].items():
            if "unreachable" in island:
                lines.append(f"{name}: unreachable: {island['unreachable']}")
                continue
            where = f" on node {island['node']}" if island.get("node") else ""
            device_work = island["device_work"]
            lines.append(f"{name}{where}: {island['runs_count']} run(s) under way, device work of "
                         f"{device_work or 'none'}{_more(island['device_work_count'], device_work)} not over")
            lines += [f"  run {r['run']} ({r['program']}, client {r['client']}) waits for {r['waits_for']}"
                      for r in island["runs"]]
            if island["runs_count"] > len(island["runs"]):
                lines.append(f"  and {island['runs_count'] - len(island['runs'])} more run(s) under way")
            if "busy" in island:
                busy = island["busy"]
                lines.append(f"  busy with run {busy['run']} ({busy['program']}): {busy['with']}, "
                             f"for {busy['seconds']} s")
            if "wedged" in island:
                lines.append(f"  {island['wedged']}")
            for peer, moves in island.get("transfers", {}).items():
                under_way = moves.get("under_way", {"pulls": 0, "offers": 0})
                lines.append(f"  moves with {peer}: {moves['path']}; pulled {moves.get('pulled', 0)}, offered "
                             f"{moves.get('offered', 0)}, by actor call {moves['by_actor_call']}; arguments pulled "
                             f"{moves.get('arguments_pulled', 0)}, offered {moves.get('arguments_offered', 0)}; "
                             f"under way: {under_way['pulls']} pull(s), {under_way['offers']} offer(s)")
        lines += [f"{island}: bytes reserved per device: {nbytes}" for island, nbytes in self["reserved"].items()]
        lines += [f"client {c}: {v['objects']} object(s), {v['bytes']} bytes" for c, v in self["clients"].items()]
        lines += [f"compiling {c['program']} for its first run, for {c['seconds']} s"
                  for c in self.get("compiling", ())]
        service = self.get("service")
        if service is not None:
            connected = service["connections"]
            lines.append(f"service on {service['address']}: {len(connected)} connected client(s)"
                         + (f" (ids {', '.join(map(str, connected))})" if connected else ""))
        return "\n".join(lines)


def _more(count: int, listed: list) -> str:
    """How many runs of `count` a list of run ids leaves out, as text."""
    return f" and {count - len(listed)} more" if count > len(listed) else ""


def gather(scheduler_status: dict | None, island_status: dict[str, dict],
           reserved: dict[str, list[int]] | None = None, compiling: list[dict] = ()) -> Status:
    """Builds a `Status` from the scheduler's report (None where it is out of reach), the islands', the
    bytes the scheduler reserves per device of each island (None: out of reach) and the plans compiling,
    summing each client's objects."""
    clients: dict[int, dict[str, int]] = {}
    for island in island_status.values():
        for client, entry in island.get("clients", {}).items():
            total = clients.setdefault(int(client), {"objects": 0, "bytes": 0})
            total["objects"] += entry["objects"]
            total["bytes"] += entry["bytes"]
    return Status(scheduler=scheduler_status, islands=island_status, clients=dict(sorted(clients.items())),
                  reserved=reserved or {}, compiling=list(compiling))
