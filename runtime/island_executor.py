"""An island's executor: the thread that executes its work in order, and the tracker that sees its
runs' device work end (see `island.py` for what an island is).

The executor takes work items and peers' deliveries off the island's inbox in the order they came and
executes their instructions, holding the island's lock only for bookkeeping; a `Recv` whose array has
not arrived parks the run, and the delivery resumes it. The tracker looks at the arrays of runs whose
dispatch is over and retires each run once its device work is done. `busy` and `wedge` say what the
executor is stuck on.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import jax
import numpy as np
from jax._src.api_util import InternalFloatingPointError   # what an executable raises under jax_debug_nans

from .island_work import (FAILED_HISTORY, HISTORY, REFERENCES, UNCHECKED, IslandRun, IslandWedged, IslandWork,
                          RunFailed, checking, client_owner, computed, without_traceback)
from .executables import ARRAY_TYPE
from .transfers import copy_to

CLOSE_JOIN = 1.0         # seconds close() waits for the executor (a wedged one is left behind)
AWAIT_PAUSE = 0.002      # the longest pause of the completion tracker between looks at a computation
_AWAIT_PAUSE_MIN = 2e-4  # and the shortest
_LANE_PAUSE = 0.02       # its pause while fast lane runs start on the island (see `_track`)
IDLE_SLEEP = 0.05        # the island's time with nothing to look at after which the tracker sleeps until woken
IN_FLIGHT = 16           # runs dispatched here whose computations may still run when the next run starts


class RunWaiters:
    """The threads waiting on one run of an island (`IslandExecutor._wait`)."""

    __slots__ = ("condition", "count")

    def __init__(self, lock: threading.Lock):
        self.condition = threading.Condition(lock)
        self.count = 0


class IslandExecutor:
    """The executor and completion tracker of an island (`Island` inherits them; its state is the island's)."""

    def busy(self) -> tuple[IslandRun, str, float] | None:
        """Returns (run, what, seconds) for the oldest thing the island is busy with: the run whose
        instructions the executor runs now, or else the run whose device work is awaited; None if idle."""
        for current, what in ((self._executing, "executing its steps"), (self._awaited, "its device work")):
            if current is not None:
                run, since = current
                return run, what, time.monotonic() - since
        return None

    def wedge(self, timeout: float) -> bool:
        """Declares the island wedged if it has been busy with one run (executing its steps, or waiting for
        its device work) for more than `timeout` seconds: that run and the runs under way here fail (and on
        their other islands), and so does new work until the stuck run's work is over. Returns whether it is
        wedged now."""
        busy = self.busy()
        if busy is None or busy[2] <= timeout:
            return self.wedged is not None
        stuck, what, seconds = busy
        told = []
        with self.lock:
            if self.wedged is None:
                since = time.strftime("%H:%M:%S", time.localtime(time.time() - seconds))
                self.wedged = IslandWedged(f"island {self.name} is wedged since {since}: run {stuck.id} of "
                                           f"{stuck.program} has been busy with {what} for more than {timeout:g} s")
                for other in [stuck, *(r for r in self._runs.values() if r is not stuck)]:
                    error = IslandWedged(f"{self.wedged}; run {other.id} of {other.program} failed with it")
                    told.append((self._fail(other.id, error, other.plan_key), other.id))
        for peers, failed in told:
            self._tell(peers, failed)
        return True

    def _serve(self) -> None:
        """The executor: takes work and deliveries off the queue, in order, until the island stops."""
        while True:
            item = self._inbox.get()
            if item is None:
                return
            handle, message = item
            del item
            with self.lock:
                while self._inline:              # work run inline on a caller's thread goes first
                    self._turn_waits += 1
                    try:
                        self._turn.wait()
                    finally:
                        self._turn_waits -= 1
            try:
                handle(message)
            finally:
                with self.lock:
                    self._pending -= 1
            del handle, message          # a waiting executor keeps no arrays of the last message alive

    def _await(self, array, since: float, deadline: float | None = None) -> bool:
        """Waits until `array` is computed, the island closes or `deadline` passes (then returns False),
        polling: a thread blocked inside XLA when the interpreter exits would abort the process, and one
        blocked there cannot give up. Each pause is a twentieth of the time waited since `since` (between
        `_AWAIT_PAUSE_MIN` and `AWAIT_PAUSE`): the end of a computation is seen within about 5% of its
        duration, and the tracker seldom takes the GIL from the threads that dispatch."""
        while not self._closed:
            if computed(array):
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            time.sleep(min(max((now - since) / 20, _AWAIT_PAUSE_MIN), AWAIT_PAUSE))
        return True

    def _stop(self) -> None:
        self._inbox.put(None)
        self._tracker_idle.set()                 # a sleeping tracker sees the island closed
        if threading.current_thread() is not self._thread:
            self._thread.join(CLOSE_JOIN)
            self._tracker.join(CLOSE_JOIN)

    def _track(self) -> None:
        """The completion tracker's thread: looks (`look`) for the end of the runs whose dispatch is over. It
        is polled, never woken per run: on these machines waking a waiting thread for every run cost the
        dispatching thread a GIL handoff of hundreds of microseconds. While a run is awaited it looks after a
        twentieth of the time waited (between `_AWAIT_PAUSE_MIN` and `AWAIT_PAUSE`), so the end of a computation
        is seen within about 5% of its duration, or, while the run is far from its expected end (its plan's
        runs' moving average), after half the time left until then (`_pause`: a run of 7 ms is looked at
        about 8 times instead of 30); it pauses `AWAIT_PAUSE` when nothing is awaited (cut short
        when a run's dispatch ends with its computation still under way: one wake per busy spell, not per run), and
        `_LANE_PAUSE` while fast lane runs start here (their caller or the executor dispatches them): each look
        takes the GIL from the dispatching thread, at the cost of a handoff, which on a loaded machine is a wait
        for the scheduler (the lane looks itself when it needs its credits back). After `IDLE_SLEEP` with no run
        to retire it sleeps until the next run's dispatch ends (`_finish` wakes it) or the island closes: an
        idle island costs no wake-ups (it cost 500 a second)."""
        idle_since = time.monotonic()
        while True:
            if not self._completions and self._closed:
                return
            self.look()
            now = time.monotonic()
            awaited = self._awaited
            if self._completions:
                idle_since = now
            if now - self._lane_started < _LANE_PAUSE:
                time.sleep(_LANE_PAUSE)
            elif awaited is None:
                self._tracker_pausing = True
                self._tracker_asleep = now - idle_since > IDLE_SLEEP
                if not (self._tracker_asleep and self._completions):   # one appended since the look wakes it
                    self._tracker_idle.wait(None if self._tracker_asleep else AWAIT_PAUSE)
                self._tracker_pausing = self._tracker_asleep = False
                self._tracker_idle.clear()
                if not self._completions:
                    continue
                idle_since = time.monotonic()
            else:
                time.sleep(self._pause(awaited[0].plan_key, awaited[1], now))
            del awaited

    def _pause(self, plan_key: int, since: float, now: float) -> float:
        """The tracker's pause at `now` while a run of a plan computes, on the devices `since`: a twentieth of the
        time waited, or half the time left until the run's expected end (the moving average of the plan's runs'
        time here, `device_clock.py`), whichever is longer, between `_AWAIT_PAUSE_MIN` and `AWAIT_PAUSE`. Looks
        thin out while a run is far from its end (each costs the threads that dispatch a GIL handoff) and come
        as often as before close to it."""
        pause = (now - since) / 20
        expected = self._durations.measured(plan_key)
        if expected is not None:
            pause = max(pause, (since + expected - now) / 2)
        return min(max(pause, _AWAIT_PAUSE_MIN), AWAIT_PAUSE)

    def look(self) -> bool:
        """The completion tracker: retires, in the order their dispatch ended, the runs whose device work is
        over (all, once the island is closed): records each one's device time (`device_clock.py`), forgets its
        arrays and tells `on_done`. Returns whether any was retired. The tracker's thread calls it, and so does
        whoever asks whether a run is over (`run_done`: the scheduler, a client, a fast lane that needs its
        credits back), so each completion is found once, by whoever looks first. Lookers take turns (a look
        never waits for a computation, so a turn is short)."""
        seen = None                              # when this look found the runs it retires over
        over = []                                # (run, device seconds) of the runs it retires
        with self._looking:
            while self._completions:
                run = self._completions[0]
                if run.latest_end is None and not self._closed and (run.executing or
                                                                     not all(map(computed, run.tracked))):
                    run.earliest_end = time.monotonic()
                    if self._awaited is None or self._awaited[0] is not run:
                        self._awaited = (run, max(run.began or 0.0, self._previous_end))
                    break
                self._completions.popleft()
                if run.latest_end is None and seen is None:
                    seen = time.monotonic()
                self._previous_end = end = run.latest_end or seen
                seconds = self._clock.end(run.id, run.earliest_end, end)
                if run.id in self._failed:
                    seconds = None                   # a failed run's time is not its plan's
                elif run.plan_key not in self._timed_plans:
                    self._timed_plans.add(run.plan_key)
                    seconds = None                   # a plan's first run here includes its first execution
                elif seconds is not None:
                    self._durations.record(run.plan_key, seconds)
                self._awaited = None
                over.append((run, seconds))
            if not over:
                return False
            with self.lock:                      # once for all the runs this look retires
                if self.wedged is not None and self._executing is None:
                    self.wedged = None           # what was stuck is over: the island serves again
                for run, seconds in over:
                    self._seconds[run.id] = None if seconds is None else seconds * run.layout.devices
                    if self._in_flight.get(run.id) is run.tracked:
                        del self._in_flight[run.id]  # nothing of the run needs to stay alive now
                while len(self._seconds) > HISTORY:
                    self._seconds.popitem(last=False)
            over = run = None                    # a looking thread keeps no arrays alive
        if self.on_done is not None:
            self.on_done()
        return True

    def _inline_over(self) -> None:
        """Work a caller ran inline (`run_inline`, `run_lane`) is over: the executor may take its turn."""
        with self.lock:
            self._end_inline()

    def _end_inline(self) -> None:
        """The caller's inline work is over: the executor may take its turn. Under the lock."""
        self._inline = False
        self._inline_run = None
        self._pending -= 1
        if self._turn_waits:
            self._turn.notify_all()

    def _lane_work(self, message, inline: bool = False) -> None:
        """A fast lane's run (`Island.start_lane`), straight through: its arguments placed, its one program
        executed (a one-island plan has no `Recv` to park at), its results kept. `inline`: the caller runs it
        (`run_lane`), and the executor may take its turn after it, under the same take of the lock."""
        run, program, collective, inputs = message
        run.last = True
        try:
            if collective and len(self._completions) >= IN_FLIGHT:
                self._hold_in_flight()
            if self._runs.get(run.id) is not run:
                return                           # cancelled before it ran: nothing of it runs
            self._place(run, inputs, True, inline)
            if not self._begin(run):
                return
            if run.checks is UNCHECKED:          # (always when inline: no context to enter)
                self._execute_lane(run, program)
            else:
                with checking(run.checks):
                    self._execute_lane(run, program)
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail_and_tell(run.id, error)
            _reraise_interrupt(error)
        finally:
            self._stopped(run, inline)

    def _execute_lane(self, run: IslandRun, program: tuple) -> None:
        """Executes a fast lane's program, stopping after an instruction that failed (or cancelled) its run."""
        runs = self._runs
        for instruction in program:
            instruction.execute(self, run)
            if runs.get(run.id) is not run:
                return                           # failed or cancelled: its next steps do not run

    @staticmethod
    def _place(run: IslandRun, inputs: tuple[tuple[int, Any], ...], executed: bool, callers: bool = False) -> None:
        """Puts a run's arguments (not `StoreRef`s or `PeerRef`s) on their home shardings; with `executed` (the
        island's program runs next, reading them), a NumPy argument its launch places is left to that launch
        (`IslandLayout.launched`), a copy of it if the arrays are still the caller's (`callers`: its work runs
        inline; a queued run's are copies already, `host_arrays_copied`): JAX's call of an executable on XLA:CPU
        may read a NumPy argument where it lies once its computation runs, after the call has returned (behind
        device work still in flight), so a batch buffer the caller refilled at once reached the run, as it
        reaches plain `jax.jit`'s. A JAX array that lies on the one device of its input's home (not donated) is
        used as it is: JAX's call of an executable takes it there, where a `jax.device_put` to the home's
        sharding, another object for the same place, cost about 40 us (`IslandLayout.one_device`)."""
        layout = run.layout
        slots, slot, found_home = run.slots, layout.slot, layout.found_home
        for buffer, value in inputs:
            kind = type(value)
            if kind is ARRAY_TYPE and (found_home.get(buffer) is value.sharding or            # (`on_home`, inline)
                                       buffer in layout.one_device and layout.on_home(buffer, value.sharding)):
                slots[slot[buffer]] = value
            elif executed and kind is np.ndarray and buffer in layout.launched:
                slots[slot[buffer]] = value.copy() if callers else value
            elif not isinstance(value, REFERENCES):
                slots[slot[buffer]] = copy_to(value, layout.shardings[buffer])

    def _hold_in_flight(self) -> None:
        """Returns once fewer than `IN_FLIGHT` runs dispatched here are still computing (or the island closed),
        before a run of the general path starts, or a fast lane's run whose program runs a collective (a lane's
        credits bound its memory, not its runs in flight). XLA:CPU (jax 0.10.2) aborts the process in an
        all-reduce's rendezvous ("expected 4 threads to join ... only 3 arrived", after 40 s) when too many
        executions with a collective are in flight: plain JAX calling a 4-device training step in a loop does,
        and so does blocking every 128 or 256 calls; blocking every 32 does not for 4 devices, but 33 lane runs
        of an 8-device step in flight did, on a loaded machine. Lane runs without a collective are not held:
        holding them cost `pw-bench multi-tenancy`'s 4-client aggregate (4-device runs, no collective) a
        quarter. The oldest runs need nothing more to finish, so waiting for them cannot wait on this thread."""
        while len(self._completions) >= IN_FLIGHT and not self._closed:
            try:
                oldest = self._completions[0]
            except IndexError:                   # retired meanwhile by another look
                continue
            since = time.monotonic()
            for array in oldest.tracked:
                self._await(array, since)
            if oldest.executing:                 # a failed run whose instruction is still under way
                time.sleep(_AWAIT_PAUSE_MIN)
            del oldest
            self.look()

    def _started(self, work: IslandWork, inline: bool = False) -> None:
        """A run's work: its inputs placed, its steps queued and executed (parking at a Recv not arrived); with
        `inline`, on the caller's thread, its NumPy arguments still the caller's (`_place`)."""
        with self.lock:
            run = self._runs.get(work.run_id)
        if run is None:
            return                              # it failed (or was cancelled) meanwhile
        self._hold_in_flight()
        if self._runs.get(work.run_id) is not run:
            return                              # cancelled while it waited: nothing of it runs
        try:
            self._place(run, work.inputs, bool(work.step_ids), inline)
            if work.step_ids:
                run.queue.append(self._program(work.plan_key, work.step_ids))
            run.last = work.last
            with self.lock:
                run.parked = run.awaiting > 0
            if run.parked:
                return                           # `_produced` resumes it (Ray's: its arguments came as copies)
            self._place_referenced(run)
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail_and_tell(run.id, error)
            _reraise_interrupt(error)
            return
        self._advance(run)

    def _delivered(self, message) -> None:
        """A peer's send: moved to its home sharding here; the run resumes if it was parked on it."""
        run_id, plan_key, buffer, array = message
        with self.lock:
            if run_id in self._failed or self._closed:
                return
        try:
            moved = copy_to(array, self._layout(plan_key).shardings[buffer])
        except BaseException as error:  # noqa: BLE001
            self._fail_and_tell(run_id, error, plan_key)
            return
        with self.lock:
            if run_id in self._failed:
                return
            run = self._runs.get(run_id)
            if run is None:
                self._early.setdefault(run_id, {})[buffer] = moved
                self._notify(run_id)
                return
            run.slots[run.layout.slot[buffer]] = moved
            self._notify(run_id)
        if self.tracer is not None:
            self.trace("recv over DCN", "dcn", _devices_of(moved, self), [moved], ("in", _flow_id(run_id, buffer)))
        self._advance(run)

    def _advance(self, run: IslandRun) -> None:
        """Executes the run's queued programs from where it stopped, until done or parked (no lock held)."""
        if run.parked:
            return                               # a delivery came first; its arguments are still awaited
        runs = self._runs
        try:
            if not self._begin(run):
                return
            with checking(run.checks):
                while run.queue:
                    program = run.queue[0]
                    pc, end = run.pc, len(program)
                    while pc < end:
                        if not program[pc].execute(self, run):
                            run.pc = pc
                            return
                        pc += 1
                        if runs.get(run.id) is not run:
                            return               # failed or cancelled: its next steps do not run
                    run.queue.popleft()
                    run.pc = 0
                    if self._waiters:
                        with self.lock:
                            self._notify(run.id)        # a fetch may wait for what this program made
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail_and_tell(run.id, error)
            _reraise_interrupt(error)
        finally:
            self._stopped(run)

    def _begin(self, run: IslandRun) -> bool:
        """Marks `run` executing here (no lock held; `_stopped` ends it) and, at its first instruction, starts
        its clock; returns False if it failed or was cancelled before (while its arguments were placed): then
        nothing of it runs. The island's executing run is set before the run's flag (`wait_run` reads them in
        that order), and the flag before the look at `_runs` (`_fail` reads them in the other order)."""
        now = time.monotonic()
        self._executing = (run, now)
        run.executing = True
        if self._runs.get(run.id) is not run:
            return False
        if run.began is None:
            run.began = now
            self._clock.begin(run.id, now)
        return True

    def _stopped(self, run: IslandRun, inline: bool = False) -> None:
        """The run's instructions stopped (all done, parked, or failed; no lock held): a wedge they caused is
        over, the run finishes if nothing of it is left here, and with `inline` the caller's turn ends, all
        under one take of the lock."""
        self._executing = None
        run.executing = False
        with self.lock:
            if self.wedged is not None and self._awaited is None:
                self.wedged = None           # the stuck instruction returned: the island serves again
            if self._runs.get(run.id) is run and run.last and not run.queue:
                self._finish(run)
            if inline:
                self._end_inline()
            if self._waiters:                # (`_notify`'s look, without its call: most runs have no waiter)
                self._notify(run.id)

    def _finish(self, run: IslandRun) -> None:
        """The run's work here is dispatched: keep its results, remember what marks it done. Under the lock."""
        layout = run.layout
        for buffer, slot in layout.passed_through:   # a result its caller's argument would be the same array
            run.slots[slot] = jax.device_put(run.slots[slot], layout.shardings[buffer], may_alias=False)
        if self._awaited_results:
            self._produced(run)
        owner = client_owner(run.client_id)
        for buffer, slot in layout.outputs:
            key = (run.id, buffer)
            if key in self._dropped:
                self._dropped.discard(key)
            else:
                self.store.add(key, owner, run.slots[slot])
        self._in_flight[run.id] = run.tracked   # before it leaves `_runs`: `run_done` reads without the lock
        del self._runs[run.id]
        run.slots = []                       # what is kept lives in the store now
        run.earliest_end = time.monotonic()
        if all(map(computed, run.tracked)):
            run.latest_end = run.earliest_end   # XLA ran it inline: its end is known now, not at a look
        self._completions.append(run)
        if self._tracker_asleep or (self._tracker_pausing and run.latest_end is None):
            self._tracker_idle.set()         # its end is to be seen, or it is to be retired: the tracker looks

    def _fail(self, run_id: int, error: BaseException, plan_key: int | None = None) -> tuple[str, ...]:
        """Fails a run here (under the lock); returns the other islands of its plan, to be told."""
        self._clock.drop(run_id)                 # (first: a look that retires the run times nothing of it)
        failed = error
        if isinstance(failed, InternalFloatingPointError):   # `jax_debug_nans`/`_infs`: what jax.jit raises
            failed = FloatingPointError(f"invalid value ({failed.ty}) encountered in {failed.name}")
        if not isinstance(failed, RunFailed):
            cause = failed
            failed = RunFailed(f"run {run_id} failed on {self.name}: {type(cause).__name__}: {cause}")
            failed.__cause__ = without_traceback(cause)
        # Before the run can look over (`run_done` and `failure` read without the lock): a scheduler that saw it
        # over with no failure retired it as a success, keeping its results' bytes for its handles.
        self._failed[run_id] = without_traceback(failed)
        while len(self._failed) > FAILED_HISTORY:
            self._failed.popitem(last=False)
        run = self._runs.get(run_id)
        if run is not None:
            # Into `_in_flight` before it leaves `_runs` (`run_done` reads without the lock), and out of `_runs`
            # before `executing` is read: an executor that marks it executing after that read sees it gone
            # (`_advance`, `_lane_work`) and runs nothing more of it.
            self._in_flight[run_id] = run.tracked
            del self._runs[run_id]
            if run.executing or not all(map(computed, run.tracked)):
                # Its instruction under way, or device work it launched, still uses its memory: the run is over
                # here (`run_done`, which gives its reservation back) once the tracker sees both end.
                run.earliest_end = time.monotonic()
                self._completions.append(run)
                self._tracker_idle.set()
            else:
                del self._in_flight[run_id]
        plan_key = run.plan_key if run is not None else plan_key
        self._early.pop(run_id, None)
        for key in [k for k in self._awaited_results if k[0] == run_id]:
            for waiter in self._awaited_results.pop(key):      # their argument will never exist
                waiter(None, error)
        if run is None:
            self.store.release_run(run_id)   # its results raise from now on (a run cancelled after dispatch)
        if self._dropped:
            self._dropped = {k for k in self._dropped if k[0] != run_id}
        self._notify(run_id)
        if self._successor is not None:      # lost and restored: the island in its place fails the run too
            self._successor.fail_run(run_id, failed)
        if plan_key is None or plan_key not in self._plans:
            return ()
        return tuple(island for island in self._plans[plan_key][0]().islands if island != self.name)

    def _produced(self, run: IslandRun) -> None:
        """`run`'s results exist: whoever awaits them gets them (`Island._kept`). Under the lock."""
        for buffer, slot in run.layout.outputs:
            for waiter in self._awaited_results.pop((run.id, buffer), ()):
                waiter(run.slots[slot], None)

    def _arrived(self, reader: IslandRun, buffer: int, producer: int | None, array, error) -> None:
        """An argument `reader` awaited is here (`array`), or its run `producer` failed (`error`): the reader
        resumes once it has every argument, or fails. Under the lock."""
        if error is not None:
            self._pending += 1
            self._inbox.put((self._argument_failed, (reader.id, producer, error)))
            return
        reader.referenced[buffer] = array
        reader.awaiting -= 1
        if reader.awaiting == 0 and reader.parked and self._runs.get(reader.id) is reader:
            self._pending += 1
            self._inbox.put((self._resume, reader))

    def _unlent(self, key: tuple[int, int], arrived, array, error) -> None:
        """Hands a donated argument over (`arrived`) once no peer has yet to pull it (`Island.returned`): the
        run may overwrite it. Under the lock."""
        if error is None and key in self._lent:
            self._returns.setdefault(key, []).append(functools.partial(arrived, array, None))
        else:
            arrived(array, error)

    def _resume(self, run: IslandRun) -> None:
        """A run parked for arguments it references has them all: places them and executes its work."""
        run.parked = False
        try:
            self._place_referenced(run)
        except BaseException as error:  # noqa: BLE001  (the run fails alone)
            self._fail_and_tell(run.id, error)
            return
        self._advance(run)

    @staticmethod
    def _place_referenced(run: IslandRun) -> None:
        for buffer, array in run.referenced.items():
            run.slots[run.layout.slot[buffer]] = copy_to(array, run.layout.shardings[buffer])
        run.referenced = {}

    def _argument_failed(self, message) -> None:
        reader, producer, error = message
        self._fail_and_tell(reader, RunFailed(f"run {reader} takes a result of run {producer}, which failed: "
                                              f"{error}"))

    def _fail_and_tell(self, run_id: int, error: BaseException, plan_key: int | None = None) -> None:
        """Fails a run here and on the other islands of its plan (called with no lock held)."""
        with self.lock:
            if run_id in self._failed:
                return
            peers = self._fail(run_id, error, plan_key)
        self._tell(peers, run_id)

    def _tell(self, peers: tuple[str, ...], run_id: int) -> None:
        """Tells the peer islands that a run failed here (no lock held: peers take their own)."""
        error = self._failed.get(run_id)
        for island in peers:
            self._peer(island).fail_run(run_id, error)

    def _wait(self, run_id: int, deadline: float | None, late: str) -> None:
        """Waits (holding the lock) until something of run `run_id` changes here, or the island closes;
        TimeoutError(`late`) once `deadline` passed. Only the threads waiting on that run wake: with several
        clients each waiting for its own results, a run's end wakes its own client's thread, not all."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError(late)
        waiters = self._waiters.get(run_id)
        if waiters is None:
            waiters = self._waiters[run_id] = RunWaiters(self.lock)
        waiters.count += 1
        try:
            waiters.condition.wait(remaining)
        finally:
            waiters.count -= 1
            if not waiters.count:
                del self._waiters[run_id]

    def _notify(self, run_id: int) -> None:
        """Wakes the threads waiting on run `run_id` here (`_wait`). Under the lock."""
        if self._waiters:
            waiters = self._waiters.get(run_id)
            if waiters is not None:
                waiters.condition.notify_all()

    def _notify_all(self) -> None:
        """Wakes every waiting thread (the island closes or is lost). Under the lock."""
        for waiters in self._waiters.values():
            waiters.condition.notify_all()

    def send(self, run: IslandRun, peer: str, peer_buffer: int, array, nbytes: int, link, kept: bool) -> None:
        """Hands `array` to `peer` as its `peer_buffer` of the run (DCN), emulating the link if asked. An array
        `kept` (a program argument or result) is copied now, in this island's order (`peer.copied`): a later run
        may donate it here, and XLA's donation waits for a copy under way, where the peer, reading it once its
        executor (or Ray's sender thread) got to it, found it deleted and failed the run (found by a review)."""
        if self.tracer is not None:
            self.trace(f"send to {peer}", "dcn", _devices_of(array, self), [array],
                       ("out", _flow_id(run.id, peer_buffer)))
        target = self._peer(peer)
        if kept:
            array = target.copied(run.plan_key, peer_buffer, array)
        if self._transport is None or self._transport.inline:
            target.deliver(run.id, run.plan_key, peer_buffer, array)
            return
        self._transport.send(array, nbytes, link, lambda moved: target.deliver(run.id, run.plan_key, peer_buffer,
                                                                               moved),
                             lambda error: target.fail_run(run.id, error))


def runs_collective(program: tuple) -> bool:
    """Whether an island program launches a collective (`IslandExecutor._hold_in_flight`)."""
    return any(getattr(i, "collective", False) for i in program)


def _flow_id(run_id: int, buffer: int) -> int:
    """The id joining the two ends of one DCN transfer in a trace: the run and the receiving buffer."""
    return run_id * 1_000_003 + buffer


def _devices_of(array, island) -> tuple[int, ...]:
    """The island-local ids of the devices an array lives on."""
    local = {d.id: i for i, d in enumerate(island.device_map.devices[island.name])}
    return tuple(sorted(local[d.id] for d in array.sharding.device_set if d.id in local))


def _reraise_interrupt(error: BaseException) -> None:
    """Raises `error` again if it is a KeyboardInterrupt (Ctrl-C, which Python raises on the main thread only):
    work the caller's thread executes (`Island.run_inline`, a fast lane's run) fails its run with it, and the
    caller gets it too, as plain JAX's would. Any other error fails the run alone."""
    if isinstance(error, KeyboardInterrupt):
        # A copy: `error` is kept as the failed run's cause, and raised it would take a traceback whose frames (the
        # caller's handles and arrays) the kept error would then hold for the island's `FAILED_HISTORY` runs.
        raise KeyboardInterrupt(*error.args) from None
