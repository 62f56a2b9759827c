"""Log following without a thread per stream, at its seams: Docker's log
response (HTTP headers, chunked body, 8-byte stream frames) parsed from
bytes split anywhere; and the one-thread follower reading real containers'
logs from a real engine, from a resume point, to their end.
"""

from __future__ import annotations

import struct
import threading

import pytest
from django.conf import settings

from jobs.node.follower import LogFollower
from jobs.node.launcher import LABEL_INSTANCE, engine_for
from jobs.node.launcher.docker_logs import LogResponseParser, SocketLogStream, parse_log_timestamp
from tests.services import BUSYBOX_IMAGE

HEAD = b"HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nTransfer-Encoding: chunked\r\n\r\n"


def frame(stream: int, text: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(text)) + text


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


ENTRIES = [
    (1, b"2026-11-24T08:01:48.636123811Z hello\n"),
    (2, b"2026-11-24T08:01:48.636123812Z on stderr\n"),
    (1, b"2026-11-24T08:01:49Z " + b"x" * 300),  # no fraction, no newline: a long line's first part
    (1, b"2026-11-24T08:01:49.5Z \xff\xfe end\n"),
]
BODY = b"".join(frame(s, t) for s, t in ENTRIES)
EXPECTED = [(1, 1795507308_636123811, b"hello\n"), (2, 1795507308_636123812, b"on stderr\n"),
            (1, 1795507309_000000000, b"x" * 300), (1, 1795507309_500000000, b"\xff\xfe end\n")]


def test_it_reads_timestamps_to_the_nanosecond():
    assert parse_log_timestamp(b"2026-11-24T08:01:48.636123811Z hi\n") == (1795507308_636123811, b"hi\n")
    assert parse_log_timestamp(b"not a timestamp") == (0, b"not a timestamp")


def test_entries_within_one_second_read_in_place_match_the_full_parse():
    # The parser reads an entry in the second of the one before it without
    # parse_log_timestamp: the same result for seconds that come back, odd
    # fractions, a frame too short for a timestamp and one with none.
    texts = [b"2026-11-24T08:01:48.000000001Z a\n", b"2026-11-24T08:01:48.999999999Z b\n",
             b"2026-11-24T08:01:49.000000000Z c\n", b"2026-11-24T08:01:48.5Z d\n",
             b"2026-11-24T08:01:49.123456789Z e\n", b"2026-11-24T08:01:49.12345678xZ f\n",
             b"short\n", b"2026-11-24T08:01:49.000000007Z ", b"2027-01-01T00:00:00.000000000Z g\n",
             b"2026-11-24T08:01:49.000000008Z h\n"]
    parser = LogResponseParser()
    got = parser.feed(b"HTTP/1.0 200 OK\r\n\r\n" + b"".join(frame(1 + i % 2, t) for i, t in enumerate(texts)))
    assert got == [(1 + i % 2, *parse_log_timestamp(t)) for i, t in enumerate(texts)]
    assert got[0][1] == 1795507308_000000001 and got[-1][1] == 1795507309_000000008


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 10_000])
def test_it_parses_a_chunked_response_split_at_every_byte(chunk_size):
    raw = HEAD + chunked(BODY, chunk_size)
    for piece in (1, 3, 50, len(raw)):
        parser = LogResponseParser()
        got = []
        for i in range(0, len(raw), piece):
            got += parser.feed(raw[i:i + piece])
        assert got == EXPECTED
        assert parser.ended


def test_it_parses_a_plain_body_until_the_connection_closes():
    parser = LogResponseParser()
    got = parser.feed(b"HTTP/1.1 200 OK\r\n\r\n" + BODY[:20])
    got += parser.feed(BODY[20:])
    assert not parser.ended
    got += parser.feed(b"")
    assert got == EXPECTED and parser.ended


def test_it_ends_a_stream_the_engine_refuses():
    import socket

    ours, theirs = socket.socketpair()
    theirs.sendall(b'HTTP/1.1 404 Not Found\r\nContent-Length: 30\r\n\r\n{"message":"No such container"}')
    stream = SocketLogStream(ours)
    assert stream.read() == [] and stream.ended
    assert "404" in stream.error
    stream.close()
    theirs.close()


def test_it_reads_nothing_while_there_is_no_room_and_goes_on_with_its_timers():
    import socket

    room = threading.Event()
    wakes: list = []

    def has_room(wake) -> bool:  # noqa: ANN001
        if not room.is_set():
            wakes.append(wake)
        return room.is_set()

    follower = LogFollower(helpers=1, room=has_room)
    follower.start()
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + BODY)
        theirs.close()
        got: list = []
        ended = threading.Event()
        follower.follow(SocketLogStream(ours), on_entries=got.extend, on_end=ended.set)
        fired = threading.Event()
        follower.call_later(0.05, fired.set)
        assert fired.wait(10)
        assert not ended.wait(0.3) and got == []  # readable all along, and left unread
        room.set()
        wakes[-1]()
        assert ended.wait(10)
        assert got == EXPECTED
    finally:
        follower.stop()


# ------------------------------------------------------------ real engine


@pytest.fixture
def engine(docker_engine):
    return engine_for(settings.DOCKER_HOST)


@pytest.fixture
def container(engine):
    import docker

    client = docker.from_env()
    made = []

    def run(command: str) -> str:
        made.append(client.containers.run(BUSYBOX_IMAGE, ["sh", "-c", command], detach=True,
                                          labels={LABEL_INSTANCE: settings.PAI_INSTANCE}).id)
        return made[-1]

    yield run
    for container_id in made:
        client.api.remove_container(container_id, force=True)


@pytest.fixture
def follower():
    made = LogFollower(helpers=2)
    made.start()
    yield made
    made.stop()


def follow_to_end(follower: LogFollower, engine, container_id: str, since_ns: int = 0,
                  follow: bool = True) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []
    ended = threading.Event()
    stream = engine.open_logs(container_id, since_ns=since_ns, follow=follow)
    follower.follow(stream, on_entries=got.extend, on_end=ended.set)
    assert ended.wait(60), "the stream did not end with its container"
    return got


def followed_and_rest(follower: LogFollower, engine, container_id: str) -> list[tuple[int, int, bytes]]:
    """As a watcher reads: followed while it runs, then once more what is
    stored (Docker 20.10 may end the followed stream before a last partial line)."""
    followed = follow_to_end(follower, engine, container_id)
    rest = follow_to_end(follower, engine, container_id, follow=False)
    assert rest[:len(followed)] == followed
    return rest


def test_it_follows_many_containers_on_one_thread_to_their_end(engine, container, follower):
    ids = [container(f"for i in 1 2 3; do echo out $i; echo err $i >&2; sleep 0.2; done; echo -n last")
           for _ in range(5)]
    before = threading.active_count()
    streams = {container_id: ([], threading.Event()) for container_id in ids}
    for container_id, (got, ended) in streams.items():  # all at once, on the one thread
        follower.follow(engine.open_logs(container_id), on_entries=got.extend, on_end=ended.set)
    assert threading.active_count() == before
    for container_id, (got, ended) in streams.items():
        assert ended.wait(60), "the stream did not end with its container"
        assert got[0][2] == b"out 1\n" or got[0][2] == b"err 1\n"
    results = [followed_and_rest(follower, engine, container_id) for container_id in ids]
    for got in results:
        assert [p for s, _, p in got if s == 1] == [b"out 1\n", b"out 2\n", b"out 3\n", b"last"]
        assert [p for s, _, p in got if s == 2] == [b"err 1\n", b"err 2\n", b"err 3\n"]
        stamps = [ts for _, ts, _ in got]
        assert all(ts > 0 for ts in stamps)
    assert follower.following == 0


def test_it_follows_from_a_resume_point(engine, container, follower):
    container_id = container("echo early; sleep 1.5; echo late")
    everything = followed_and_rest(follower, engine, container_id)
    late = [ts for _, ts, p in everything if p == b"late\n"][0]
    # Whole seconds: the engine may send a little before the point, never after it.
    resumed = follow_to_end(follower, engine, container_id, since_ns=late)
    assert resumed[-1][2] == b"late\n" and all(ts >= late - 1_000_000_000 for _, ts, _ in resumed)


def test_it_ends_the_stream_of_a_container_that_does_not_exist(engine, follower):
    assert follow_to_end(follower, engine, "no-such-container-" + "0" * 20) == []


def test_it_runs_delayed_work_on_a_helper(follower):
    done = threading.Event()
    names = []
    follower.call_later(0.05, lambda: (names.append(threading.current_thread().name), done.set()))
    assert done.wait(10)
    assert names[0].startswith("task-helper-")
