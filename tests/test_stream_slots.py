"""The limit on streamed responses one user may have open at once
(STREAMED_RESPONSES_PER_USER, jobs/services/stream_slots.py): on each of
the four streaming endpoints through Django's test client, against the test
run's real Redis.

A stream is held open the way a slow client holds it: its response is kept
unread, or read in part. Closing the response is what the server does when
the client has read it all, has gone away, or the stream failed.
"""

from __future__ import annotations

import gc
import io
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import Client
from redis import Redis

from jobs import queues, storage
from jobs.api import serializers
from jobs.models import LogLine, Stream, User
from jobs.services import stream_slots, tokens
from tests.conftest import unique
from tests.test_pages import ended_job, task_attempt

LIMIT = 2


@pytest.fixture(autouse=True)
def limit(settings, own_instance) -> int:
    """A small limit, and Redis keys of the test's own (own_instance)."""
    settings.STREAMED_RESPONSES_PER_USER = LIMIT
    return LIMIT


# ------------------------------------------------------------ the endpoints


def _page_client(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _api_client(user: User | None) -> Client:
    if user is None:
        return Client()
    key = tokens.token_create(user=user, lifetime=timedelta(hours=1)).key
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def _log_of(user: User) -> str:
    job = ended_job(user, unique("logged"))
    attempt = task_attempt(job)
    LogLine.objects.bulk_create(LogLine(attempt=attempt, stream=Stream.STDOUT, seq=i, text=f"line {i}")
                                for i in range(5))
    return f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/download/"


def _file_of(user: User) -> str:
    path = f"/{user.username}/{unique('data')}.bin"
    storage.backend().write(path, io.BytesIO(b"x" * 4096))
    return f"/storage/download/?path={path}"


def _job_list_of(user: User) -> str:
    ended_job(user, unique("listed"))
    return f"/api/v1/user/{user.username}/jobs"


def _attempts_of(user: User) -> str:
    job = ended_job(user, unique("attempted"))
    return f"/api/v2/jobs/{user.username}~{job.name}/job-attempts"


@dataclass(frozen=True)
class Endpoint:
    name: str
    make: Callable[[User], str]  # something of the user's to stream: its URL
    client: Callable[[User | None], Client]  # signed in as the user; None: anonymous
    stranger: int  # another user asking for it: what they get today
    anonymous: int
    missing: Callable[[User], str]  # what is not there (or not the user's to ask for)
    api: bool

    def __str__(self) -> str:
        return self.name


ENDPOINTS = [
    Endpoint("log download", _log_of, _page_client, stranger=404, anonymous=302, api=False,
             missing=lambda user: "/jobs/0/logs/0/stdout/download/"),
    Endpoint("storage download", _file_of, _page_client, stranger=403, anonymous=302, api=False,
             missing=lambda user: f"/storage/download/?path=/{user.username}/no-such-file"),
    Endpoint("v1 whole job list", _job_list_of, _api_client, stranger=403, anonymous=401, api=True,
             missing=lambda user: "/api/v1/user/somebody_else/jobs"),
    Endpoint("v2 job attempts", _attempts_of, _api_client, stranger=404, anonymous=401, api=True,
             missing=lambda user: f"/api/v2/jobs/{user.username}~no_such_job/job-attempts"),
]


def _held(user: User) -> int:
    return stream_slots.streams_open(holder=stream_slots.holder_of(user=user, address=""))


def _open(client: Client, url: str, *, read: bool = False):
    """A stream left open: unread, or with its first part read."""
    response = client.get(url)
    assert response.status_code == 200 and response.streaming, (url, response.status_code)
    if read:
        next(iter(response.streaming_content))
    return response


def _fill(endpoint: Endpoint, user: User) -> tuple[Client, str, list]:
    client, url = endpoint.client(user), endpoint.make(user)
    streams = [_open(client, url, read=n == 0) for n in range(LIMIT)]
    assert _held(user) == LIMIT
    return client, url, streams


def _assert_refused(endpoint: Endpoint, response) -> None:
    assert response.status_code == 429 and not response.streaming
    assert response["Retry-After"] == str(stream_slots.RETRY_AFTER_SECONDS)
    if endpoint.api:
        body = response.json()
        assert body["code"] == "TooManyRequestsError"
        message = body["message"]
    else:
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        message = response.content.decode()
    assert f"You have {LIMIT} downloads or whole lists open already" in message
    assert f"(STREAMED_RESPONSES_PER_USER={LIMIT})" in message


# ------------------------------------------------------- on each endpoint


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_it_refuses_a_stream_past_the_limit_and_lets_other_users_stream(endpoint, alice, bob):
    client, url, streams = _fill(endpoint, alice)
    _assert_refused(endpoint, client.get(url))
    assert _held(alice) == LIMIT  # the refusal took nothing
    bobs = _open(endpoint.client(bob), endpoint.make(bob))
    for response in [*streams, bobs]:
        response.close()
    assert _held(alice) == 0 and _held(bob) == 0


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_it_frees_a_slot_when_a_stream_ends_or_is_closed(endpoint, alice):
    client, url, streams = _fill(endpoint, alice)
    streams[1].close()  # never read: a client gone before the first byte
    assert _held(alice) == LIMIT - 1
    read_whole = _open(client, url)
    assert b"".join(read_whole.streaming_content)  # read to its end: the test client closes it, as a server does
    assert _held(alice) == LIMIT - 1
    streams[0].close()  # read in part, then the client went away
    assert _held(alice) == LIMIT - 2
    again = [_open(client, url) for _ in range(LIMIT)]
    _assert_refused(endpoint, client.get(url))
    for response in again:
        response.close()
        response.close()  # Django may close twice: nothing is released twice
    assert _held(alice) == 0


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_it_drops_the_slots_of_a_worker_that_died(endpoint, alice):
    """A killed worker neither releases nor refreshes its slots: they run out
    on their own. Here, as it finds them once their time has passed."""
    redis = queues.connection()
    key = stream_slots._key(stream_slots.holder_of(user=alice, address=""))
    seconds, _ = redis.time()
    redis.zadd(key, {f"dead-{n}": seconds - 1 for n in range(LIMIT)})
    client, url = endpoint.client(alice), endpoint.make(alice)
    response = _open(client, url)
    assert redis.zcard(key) == 1  # the dead worker's slots are gone; this stream holds the one left
    response.close()
    assert redis.zcard(key) == 0


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_strangers_anonymous_callers_and_missing_things_are_answered_as_before_without_slots(endpoint, alice, bob):
    """The limit comes after the checks: a refused request gets the answer it
    always got (never a 429, even with the owner at her limit) and takes no
    one's slot."""
    client, url, streams = _fill(endpoint, alice)
    assert endpoint.client(bob).get(url).status_code == endpoint.stranger
    assert endpoint.client(None).get(url).status_code == endpoint.anonymous
    assert client.get(endpoint.missing(alice)).status_code in (403, 404)
    assert _held(alice) == LIMIT and _held(bob) == 0
    assert stream_slots.streams_open(holder=stream_slots.holder_of(user=AnonymousUser(), address="127.0.0.1")) == 0
    for response in streams:
        response.close()
    assert _held(alice) == 0


# ------------------------------------------------------------- the rest


def test_a_stream_that_fails_gives_its_slot_back(alice, monkeypatch):
    def broken(job):
        raise RuntimeError("a bug in the middle of a list")

    monkeypatch.setattr(serializers, "job_summary", broken)
    client = _api_client(alice)
    response = _open(client, _job_list_of(alice))
    with pytest.raises(RuntimeError, match="a bug"):
        b"".join(response.streaming_content)  # the test client closes it, as the server does after an error
    assert _held(alice) == 0


def test_a_held_stream_closes_what_it_streams_and_releases_once():
    closed: list[str] = []

    class Download:
        def __iter__(self) -> Iterator[bytes]:
            yield b"a"
            raise OSError("the storage went away")

        def close(self) -> None:
            closed.append("download")

    slot = stream_slots.stream_slot_take(holder=f"user:{unique('held')}")
    held = stream_slots.HeldStream(Download(), slot)
    assert next(held) == b"a"
    with pytest.raises(OSError):
        next(held)
    held.close()
    assert closed == ["download"]  # what Django would have closed: an HDFS connection, say
    assert queues.connection().zscore(slot.key, slot.member) is None


def test_a_refused_stream_closes_what_it_would_have_streamed(alice):
    for _ in range(LIMIT):
        stream_slots.stream_hold(user=alice, address="", content=iter([b"x"]))
    opened = io.BytesIO(b"an open file or connection")
    with pytest.raises(stream_slots.TooManyStreams):
        stream_slots.stream_hold(user=alice, address="", content=opened)
    assert opened.closed


@pytest.mark.parametrize("endpoint", [endpoint for endpoint in ENDPOINTS if endpoint.api], ids=str)
def test_a_head_request_is_answered_with_every_slot_taken_and_takes_none(endpoint, alice, bob):
    """HEAD has no body: nothing to read (a whole job list), nothing to hold.
    The pages' downloads answer HEAD with 405 (GET only)."""
    client, url, streams = _fill(endpoint, alice)
    answer = client.head(url)
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    assert b"".join(answer.streaming_content) == b""
    assert _held(alice) == LIMIT
    assert endpoint.client(bob).head(url).status_code == endpoint.stranger
    assert endpoint.client(None).head(url).status_code == endpoint.anonymous
    for response in streams:
        response.close()
    assert _held(alice) == 0


def test_a_head_request_closes_what_it_would_have_streamed_unread(alice):
    started = []

    def parts() -> Iterator[bytes]:
        started.append(True)
        yield b"a whole job list"

    content = parts()
    assert list(stream_slots.stream_hold(user=alice, address="", content=content, head=True)) == []
    assert not started and content.gi_frame is None  # closed, never run
    opened = io.BytesIO(b"an open file or connection")
    stream_slots.stream_hold(user=alice, address="", content=opened, head=True)
    assert opened.closed and _held(alice) == 0


def test_a_refused_download_closes_its_storage_read_before_reading_any_of_it(alice):
    """storage.files.file_read's content, as a WebHDFS read gives it: open
    before the first byte (files._AtMost passes the close on)."""
    from jobs.storage.files import _AtMost

    class Read:
        closed = False

        def __iter__(self) -> Iterator[bytes]:
            yield b"x" * 10

        def close(self) -> None:
            self.closed = True

    for _ in range(LIMIT):
        stream_slots.stream_hold(user=alice, address="", content=iter([b"x"]))
    read = Read()
    with pytest.raises(stream_slots.TooManyStreams):
        stream_slots.stream_hold(user=alice, address="", content=_AtMost(read, 10))
    assert read.closed
    grown = Read()
    assert b"".join(_AtMost(grown, 4)) == b"xxxx" and grown.closed  # no more than announced, then closed


def test_a_live_worker_keeps_its_slots_and_a_dead_ones_run_out(monkeypatch):
    """Slots last SLOT_SECONDS past the last refresh: the worker refreshes
    the ones it holds (even while a client reads nothing and the stream's
    thread waits), and a worker that died refreshes none."""
    monkeypatch.setattr(stream_slots, "SLOT_SECONDS", 1)
    holder = f"user:{unique('refreshed')}"
    live = stream_slots.stream_slot_take(holder=holder)
    dead = stream_slots.stream_slot_take(holder=holder)
    stream_slots._worker_streams.give_back(dead)  # as if its worker had been killed: no one refreshes or releases it
    for _ in range(3):
        time.sleep(0.5)
        stream_slots.stream_slots_refresh()
    assert stream_slots.streams_open(holder=holder) == 1  # 1.5 s on: the live one only
    queues.connection().zrem(live.key, live.member)  # released by Redis's clock just before a refresh lands
    stream_slots.stream_slots_refresh()
    assert queues.connection().zscore(live.key, live.member) is None  # not brought back
    live.release()


def test_the_worker_runs_one_refresher():
    slot = stream_slots.stream_slot_take(holder=f"user:{unique('refresher')}")
    assert [thread.name for thread in threading.enumerate()].count("stream-slots") == 1
    slot.release()


def test_anonymous_callers_share_one_limit_per_address(settings):
    settings.API_ANONYMOUS_READ = True
    here, there = Client(REMOTE_ADDR="198.51.100.77"), Client(REMOTE_ADDR="198.51.100.78")
    streams = [_open(here, "/api/v1/jobs") for _ in range(LIMIT)]
    refused = here.get("/api/v1/jobs")
    assert refused.status_code == 429 and refused.json()["code"] == "TooManyRequestsError"
    assert refused.json()["message"].startswith(f"Anonymous clients at your address have {LIMIT} downloads")
    assert here.get("/api/v1/jobs", {"limit": 1}).status_code == 200  # a page is not a stream
    streams.append(_open(there, "/api/v1/jobs"))
    for response in streams:
        response.close()


def test_streams_go_ahead_uncounted_when_redis_is_down(alice, monkeypatch):
    """As the other rate limits do: a Redis outage must not stop everyone's
    downloads (and never answers 500)."""
    client, url = _page_client(alice), _log_of(alice)
    down = Redis(unix_socket_path="/nonexistent/redis.sock", socket_connect_timeout=1)
    with monkeypatch.context() as patched:  # undone before own_instance cleans up through the real one
        patched.setattr(queues, "connection", lambda: down)
        streams = [_open(client, url) for _ in range(LIMIT + 1)]
        for response in streams:
            response.close()


# ------------------------------------------------- a web worker's own limit


@pytest.mark.parametrize("endpoint", [ENDPOINTS[0], ENDPOINTS[2]], ids=str)
def test_a_worker_streams_to_all_its_threads_but_two_at_most(endpoint, alice, bob, settings):
    """However many users stream, two of a web worker's threads stay for
    everyone's pages and API calls: past that, 503 with Retry-After."""
    settings.PORTAL_HTTP_THREADS = 3  # one thread to stream with
    alices = _open(endpoint.client(alice), endpoint.make(alice))
    refused = endpoint.client(bob).get(endpoint.make(bob))
    assert refused.status_code == 503 and not refused.streaming
    assert refused["Retry-After"] == str(stream_slots.RETRY_AFTER_SECONDS)
    message = refused.json()["message"] if endpoint.api else refused.content.decode()
    if endpoint.api:
        assert refused.json()["code"] == "ServiceUnavailableError"
    assert "The server is sending as many downloads and whole lists as it can at once (1)" in message
    assert _held(bob) == 0  # refused by the worker: nothing of bob's held
    alices.close()
    bobs = _open(endpoint.client(bob), endpoint.make(bob))
    bobs.close()
    assert _held(alice) == 0 and _held(bob) == 0 and stream_slots._worker_streams.open == 0


def test_a_users_own_refusal_gives_the_workers_place_back(alice, monkeypatch):
    made: list[stream_slots.StreamSlot] = []  # kept alive: only give_back may free a place
    real_init = stream_slots.StreamSlot.__init__

    def kept(self, *args, **kwargs) -> None:
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(stream_slots.StreamSlot, "__init__", kept)
    client, url = _page_client(alice), _log_of(alice)
    streams = [_open(client, url) for _ in range(LIMIT)]
    assert client.get(url).status_code == 429
    assert len(made) == LIMIT + 1 and stream_slots._worker_streams.open == LIMIT
    for response in streams:
        response.close()
    assert stream_slots._worker_streams.open == 0


def test_anonymous_ipv6_callers_share_one_limit_per_64(settings):
    anonymous = AnonymousUser()
    holder = stream_slots.holder_of
    assert holder(user=anonymous, address="2001:db8:1:2::1") == holder(user=anonymous, address="2001:db8:1:2:ffff::9")
    assert holder(user=anonymous, address="2001:db8:1:2::1") != holder(user=anonymous, address="2001:db8:1:3::1")
    assert holder(user=anonymous, address="::ffff:198.51.100.7") == holder(user=anonymous, address="198.51.100.7")
    assert holder(user=anonymous, address="not an address") == "address:not an address"
    assert holder(user=anonymous, address="64:ff9b::c633:6407") == holder(user=anonymous, address="198.51.100.7")
    assert holder(user=anonymous, address="fe80::1%eth0") != holder(user=anonymous, address="fe80::2%eth0")
    settings.API_ANONYMOUS_READ = True
    one, same_64 = Client(REMOTE_ADDR="2001:db8:5:6::1"), Client(REMOTE_ADDR="2001:db8:5:6::2")
    streams = [_open(one, "/api/v1/jobs") for _ in range(LIMIT)]
    assert same_64.get("/api/v1/jobs").status_code == 429
    streams.append(_open(Client(REMOTE_ADDR="2001:db8:5:7::1"), "/api/v1/jobs"))
    for response in streams:
        response.close()


def test_a_slot_dropped_without_its_release_gives_the_workers_place_back():
    slot = stream_slots.stream_slot_take(holder=f"user:{unique('dropped')}")
    assert stream_slots._worker_streams.open == 1
    del slot  # a response never closed (a bug): its Redis entry runs out; its worker place goes now
    gc.collect()
    assert stream_slots._worker_streams.open == 0
