"""The driver's connection to an island actor (`runtime/ray_backend/connection.py`), without Ray: its frames
encoded and read back, malformed ones refused, and replies handed to the waiters they answer, over a real
socket pair whose other end the test plays."""

import socket
import threading

import numpy as np
import pytest

from fetching import until
from pathways_mlir.runtime.island_work import IslandWork, PeerRef, RunCancelled, StoreRef
from pathways_mlir.runtime.ray_backend import connection
from pathways_mlir.runtime.ray_backend.data_plane import Lend, Withdraw
from pathways_mlir.runtime.wire import FrameReader, ProtocolError, frame_parts, send_message

WAIT = 30.0     # seconds any wait of these tests may take


def test_a_start_message_reads_back_as_sent():
    work = IslandWork(7, 12, 3, 99, (0, 2), ((0, np.arange(6, dtype=np.float32).reshape(2, 3)), (1, StoreRef(4, 5)),
                                             (2, PeerRef(4, 6, 98, "island1", "f32", (2,), ("data",), (("data",), ())))),
                      last=False)
    lends = [Lend(4, 6, 98, 12, 2, "island1", (2,)), Withdraw("island2")]
    header, arrays = connection.encode_start(5, work, [(1, 2), (3, 4)], lends)
    number, decoded, releases, lent = connection.decode_start(header, arrays)
    assert (number, releases, lent) == (5, [(1, 2), (3, 4)], lends)
    assert decoded._replace(inputs=()) == work._replace(inputs=())
    np.testing.assert_array_equal(decoded.inputs[0][1], work.inputs[0][1])
    assert decoded.inputs[1:] == work.inputs[1:]
    assert connection.decode_start(*connection.encode_start(6, None, [], [])) == (6, None, [], [])


@pytest.mark.parametrize("header", [
    {"number": "5", "work": None, "releases": [], "lends": []},
    {"number": 5, "work": None, "releases": [[1]], "lends": []},
    {"number": 5, "work": None, "releases": [], "lends": [["steal", 1]]},
    {"number": 5, "work": {"ticket": 1, "run": 2, "client": 3, "plan": 4, "steps": [0], "last": True,
                           "inputs": [[0, "array", 3]]}, "releases": [], "lends": []},
    {"number": 5, "work": {"ticket": 1, "run": 2, "client": 3, "plan": 4, "steps": [0], "last": True,
                           "inputs": [[0, "pickle", "..."]]}, "releases": [], "lends": []},
    {"work": None},
], ids=["number", "release", "lend", "array", "input kind", "missing"])
def test_a_malformed_start_message_is_a_protocol_error(header):
    with pytest.raises(ProtocolError, match="^a malformed start message: "):
        connection.decode_start(header, [])


def test_requests_read_back_and_malformed_ones_are_protocol_errors():
    assert connection.decode_request({"request": 1, "kind": "fetch", "run": 2, "buffer": 3, "timeout": None,
                                      "siblings": [[2, 4], [5, 6]], "value": True}) == \
        connection.Request(1, "fetch", 2, 3, None, ((2, 4), (5, 6)), True)
    assert connection.decode_request({"request": 2, "kind": "runs_done", "runs": [5, 6]}).runs == (5, 6)
    assert connection.decode_request({"request": 3, "kind": "wait_run", "run": 7, "timeout": 1.5}).timeout == 1.5
    for header in ({"request": 1, "kind": "fetch", "run": 2, "buffer": 3, "timeout": -1, "siblings": [],
                    "value": True},
                   {"request": 1, "kind": "fetch", "run": 2, "buffer": 3, "timeout": None, "siblings": [4],
                    "value": True},
                   {"request": 1, "kind": "exec", "timeout": None},
                   {"request": "1", "kind": "runs_done", "runs": []},
                   {"request": 1, "kind": "runs_done", "runs": [True]}):
        with pytest.raises(ProtocolError, match="^a malformed request: "):
            connection.decode_request(header)


class Peer:
    """The actor's end of a socket pair, played by the test: reads the driver's frames, answers as told."""

    def __init__(self, sock: socket.socket):
        sock.settimeout(WAIT)
        self.sock, self.reader = sock, FrameReader(sock)

    def request(self) -> dict:
        header, _ = self.reader.recv()
        assert "request" in header
        return header


def fetching(ours, timeout=None) -> tuple[threading.Thread, list]:
    """Starts a thread fetching buffer 0 of run 1 over `ours`; returns it and the list its error goes to."""
    errors = []

    def fetch():
        try:
            ours.fetch(1, 0, timeout, [])
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    thread = threading.Thread(target=fetch)
    thread.start()
    return thread, errors


@pytest.fixture
def pair():
    driver_end, actor_end = socket.socketpair()
    driver_end.settimeout(WAIT)
    ours = connection.IslandConnection(driver_end)
    yield ours, Peer(actor_end)
    ours.close()                  # (its writer thread, if it started one, ends)
    actor_end.close()


def test_replies_reach_the_waiters_they_answer_whatever_their_order(pair):
    ours, peer = pair
    results = {}

    def fetch(run):
        results[run] = ours.fetch(run, 0, None, [(1, 1)] if run == 1 else [])

    threads = [threading.Thread(target=fetch, args=(run,)) for run in (1, 2)]
    for thread in threads:
        thread.start()
    requests = {(r := peer.request())["run"]: r["request"] for _ in range(2)}
    send_message(peer.sock, {"taken": 0})                                      # an acknowledgement between them
    send_message(peer.sock, {"reply": requests[2], "siblings": []}, [np.full(2, 2.0)])
    send_message(peer.sock, {"reply": requests[1], "siblings": [[1, 1]]}, [np.full(3, 1.0), np.zeros(1, np.int32)])
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads)
    np.testing.assert_array_equal(results[2][0], np.full(2, 2.0))
    np.testing.assert_array_equal(results[1][0], np.full(3, 1.0))
    assert list(results[1][1]) == [(1, 1)] and results[2][1] == {}
    ours.wait_taken(0)                                                          # read by a fetch meanwhile
    assert ours.taken == 0


def test_an_error_reply_raises_the_islands_error_by_kind(pair):
    ours, peer = pair
    thread, errors = fetching(ours, 5.0)
    request = peer.request()["request"]
    send_message(peer.sock, connection.error_reply(request, RunCancelled("run 1 was cancelled")))
    thread.join(WAIT)
    assert type(errors[0]) is RunCancelled and str(errors[0]) == "run 1 was cancelled"


def test_a_connection_that_breaks_fails_every_waiter_and_later_call(pair):
    ours, peer = pair
    thread, errors = fetching(ours)
    peer.request()
    send_message(peer.sock, {"surprise": 1})                 # neither an acknowledgement nor a reply
    thread.join(WAIT)
    assert isinstance(errors[0], connection.ConnectionBroken)
    assert "neither an acknowledgement nor a reply" in str(errors[0])
    with pytest.raises(connection.ConnectionBroken):
        ours.wait_taken(0)
    with pytest.raises(connection.ConnectionBroken):
        ours.send({"number": 0})


def test_closing_the_connection_fails_a_waiting_fetch(pair):
    """A proxy hangs up on an actor it knows dead (a node killed hard never closes its end): the fetch that
    waits for a value raises instead of waiting for it."""
    ours, peer = pair
    thread, errors = fetching(ours)
    peer.request()                        # the request arrived; no reply will come
    ours.close()
    thread.join(WAIT)
    assert not thread.is_alive() and isinstance(errors[0], connection.ConnectionBroken)


def test_a_send_the_actor_does_not_read_returns_and_the_frames_arrive_in_order_as_they_were(pair):
    """The scheduler sends starts under its lock: a frame larger than the sockets hold, to an actor that does not
    read (stalled, or busy), kept every client and `status` waiting for up to `REPLY_TIMEOUT` (found by a
    review). The send now returns at once; the writer sends the rest, and what the caller changes in its
    arrays afterwards does not change what arrives."""
    ours, peer = pair
    large = np.arange(4 << 20, dtype=np.float32)             # 16 MiB: far more than the socket pair holds
    ours.send(*connection.encode_start(0, None, [], []))
    returned = threading.Event()
    threading.Thread(target=lambda: (ours.send({"number": 1, "work": None, "releases": [], "lends": []}, [large]),
                                     returned.set()), daemon=True).start()
    assert returned.wait(WAIT), "a send returned without the actor reading"
    large[:] = -1                                             # the caller's array, changed once the call returned
    thread, errors = fetching(ours, 5.0)                     # a request, behind the start
    assert peer.reader.recv()[0]["number"] == 0
    header, [arrived] = peer.reader.recv(connection.LIMITS)
    assert header["number"] == 1
    np.testing.assert_array_equal(arrived, np.arange(4 << 20, dtype=np.float32))
    request = peer.request()["request"]
    send_message(peer.sock, {"reply": request, "siblings": []}, [np.zeros(1)])
    thread.join(WAIT)
    assert not thread.is_alive() and not errors


def test_an_actor_that_reads_nothing_for_the_sockets_timeout_breaks_the_connection():
    """The writer's send waits at most the socket's timeout (`REPLY_TIMEOUT`) for the actor to read; then the
    connection is broken, the proxy is told (its actor is lost), and a later send raises."""
    driver_end, actor_end = socket.socketpair()
    driver_end.settimeout(0.5)
    told = []
    ours = connection.IslandConnection(driver_end, told.append)
    try:
        ours.send({"number": 0}, [np.zeros(4 << 20, np.float32)])
        until(lambda: told, "the proxy told", WAIT)
        assert isinstance(told[0], connection.ConnectionBroken) and "timed out" in str(told[0]), told
        with pytest.raises(connection.ConnectionBroken):
            ours.send({"number": 1})
    finally:
        ours.close()
        actor_end.close()


def test_a_send_behind_more_than_queued_bytes_waits_for_the_writer_bounded(pair, monkeypatch):
    """Copies of what the socket did not take are held for the writer: with no bound, a slow actor left the
    driver holding every queued run's arguments (320 MiB from 20 sends of 16 MiB, found by a review). A send
    finding more than `QUEUED` bytes unsent waits for the writer, and breaks the connection once the actor read
    nothing for `REPLY_TIMEOUT`."""
    ours, peer = pair
    monkeypatch.setattr(connection, "QUEUED", 1 << 20)
    monkeypatch.setattr(connection, "REPLY_TIMEOUT", 0.5)
    ours.send({"number": 0}, [np.zeros(4 << 20, np.float32)])          # 16 MiB: most of it queued
    assert ours._queued > connection.QUEUED
    with pytest.raises(connection.ConnectionBroken, match=r"the actor read nothing of \d+ bytes for 0.5 s"):
        ours.send({"number": 1}, [np.zeros(4 << 20, np.float32)])     # not queued: never copied


def test_stalled_says_how_long_the_oldest_unacknowledged_start_waited_reading_what_came(pair):
    """The island monitor's look (`stalled`): the acknowledgements that came are read without waiting (the actor
    blocks once they fill the socket), and the wait of the oldest start not acknowledged is told; none: 0."""
    ours, peer = pair
    assert ours.stalled() == 0.0
    for number in range(3):
        ours.send_start(number, None, [], [])
    assert [peer.reader.recv()[0]["number"] for _ in range(3)] == [0, 1, 2]
    send_message(peer.sock, {"taken": 0}, ())
    until(lambda: ours.stalled() > 0.0 and ours.taken == 0, "start 0's acknowledgement read", WAIT)
    first = ours.stalled()
    until(lambda: ours.stalled() > first, "the wait of start 1 grows", WAIT)
    send_message(peer.sock, {"taken": 2}, ())
    until(lambda: ours.stalled() == 0.0, "starts 1 and 2 acknowledged", WAIT)
    assert ours.taken == 2


def test_a_poll_hands_a_reply_it_reads_to_its_waiter_and_raises_once_the_connection_broke(pair):
    ours, peer = pair
    thread, errors = fetching(ours)
    request = peer.request()["request"]
    send_message(peer.sock, {"reply": request, "siblings": []}, [np.zeros(1)])
    ours.poll()                               # whoever reads the reply, the fetch gets it
    thread.join(WAIT)
    assert not thread.is_alive() and not errors
    peer.sock.close()
    with pytest.raises(connection.ConnectionBroken):
        until(lambda: ours.poll(), "the closed end seen", WAIT)


def test_a_poll_leaves_a_frame_begun_for_a_later_reader_and_waits_for_none_of_it(pair, monkeypatch):
    """The start channel polls under the scheduler's lock: a frame the actor began and stopped in (a reply
    nobody waits for any more, the actor's process stopped) held the poll, and every client, for its rest, up to
    `REPLY_TIMEOUT` (found by a review). The poll takes whole frames only; the monitor's look reads the rest."""
    ours, peer = pair
    monkeypatch.setattr(connection, "REPLY_TIMEOUT", 600.0)
    with pytest.raises(TimeoutError):
        ours.fetch(1, 0, 0.1, [])                     # given up: its reply is nobody's
    request = peer.request()["request"]
    reply = b"".join(bytes(memoryview(part).cast("B")) for part in frame_parts(
        {"reply": request, "siblings": []}, [np.zeros(1 << 14, np.uint8)], connection.LIMITS))
    send_message(peer.sock, {"taken": 0}, ())
    peer.sock.sendall(reply[:len(reply) // 2])
    polled = threading.Thread(target=ours.poll)
    polled.start()
    polled.join(WAIT)
    assert not polled.is_alive(), "the poll waited for the rest of the frame"
    assert ours.taken == 0                            # the whole frame before it was read
    peer.sock.sendall(reply[len(reply) // 2:])
    send_message(peer.sock, {"taken": 1}, ())
    until(lambda: (ours.poll(), ours.taken == 1)[1], "the frames after it read", WAIT)


def test_a_start_whose_bytes_are_still_going_out_is_no_stall(pair):
    """The monitor took an actor for stalled once a start went unacknowledged for `REPLY_TIMEOUT` from when it
    was queued: a healthy actor reading a large start slowly was lost (found by a review). While the writer
    holds bytes (its sends are bounded by the socket's timeout) nothing is owed; once it handed the socket all,
    the wait counts from then."""
    ours, peer = pair
    big = IslandWork(0, 1, 0, 7, (0,), ((0, np.zeros(4 << 20, np.uint8)),), True)
    ours.send_start(0, big, [], [])
    assert ours._queued > 0 and ours.stalled() == 0.0
    header, _ = peer.reader.recv(connection.LIMITS)   # the actor reads it all, and acknowledges nothing yet
    assert header["number"] == 0
    until(lambda: ours._queued == 0, "the writer handed the socket all it held", WAIT)
    until(lambda: ours.stalled() > 0.0, "the acknowledgement owed", WAIT)
    send_message(peer.sock, {"taken": 0}, ())
    until(lambda: ours.stalled() == 0.0, "nothing owed once acknowledged", WAIT)
