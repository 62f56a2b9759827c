"""Notifications of job state changes: webhooks and e-mail.

Against real receivers: a small threaded HTTP server on 127.0.0.1 in this
process, and aiosmtpd's SMTP server on a free 127.0.0.1 port. State changes
are driven in-process through the services, as tests/test_lifecycle.py
does, with a notify queue of the test's own (`drain`: no node agent serves
it) worked in-process by RQ's SimpleWorker; the last test runs a real job
on the real test cluster, whose agents deliver.

The test processes allow 127.0.0.0/8 (WEBHOOK_ALLOWED_NETWORKS in
tests/settings.py); the default, public addresses only, is tested here too.
"""

from __future__ import annotations

import email
import hashlib
import hmac
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client
from django.utils import timezone
from rq import SimpleWorker

from jobs import queues, services, webhooks
from jobs.models import NotificationDelivery, NotificationSettings, State
from jobs.services import lifecycle, notifications, tokens
from tests.cluster import ROOT, free_port, wait_for
from tests.helpers import config, role, submit, wait_state
from tests.test_lifecycle import exit_, gpu_job, node, start  # noqa: F401  (node: a fixture)

SECRET = "a-webhook-secret-for-tests"
NEVER_FITS_GPUS = 64  # no node has that many: the job waits until it is stopped
Status = NotificationDelivery.Status


class Receiver:
    """A webhook receiver on 127.0.0.1. Records every request; answers each
    with the next of `statuses` (then 200), after `delay` seconds."""

    def __init__(self, statuses: tuple[int, ...] = (), delay: float = 0.0, location: str = "",
                 judge: Callable[[dict, bytes], int] | None = None) -> None:
        self.requests: list[dict] = []
        self.statuses = list(statuses)
        self.judge = judge  # answers instead of `statuses`, from the request's headers and body
        self.delay = delay
        self.location = location
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    receiver.requests.append({"path": self.path, "body": body, "headers": headers})
                    if receiver.judge is not None:
                        status = receiver.judge(headers, body)
                    else:
                        status = receiver.statuses.pop(0) if receiver.statuses else 200
                time.sleep(receiver.delay)
                self.send_response(status)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        return Handler

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook?team=7"

    def wait(self, count: int, timeout: float = 30.0) -> list[dict]:
        wait_for(lambda: len(self.requests) >= count, timeout=timeout, what=f"{count} webhook requests")
        return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


TOLERANCE_SECONDS = 300  # a receiver's choice; README suggests five minutes


def signature_problem(headers: dict[str, str], body: bytes, secret: str = SECRET, now: float | None = None) -> str:
    """What a receiver finds wrong with a delivery, checked as README's
    "Webhooks and e-mail" tells receivers to: "" when it is the portal's,
    signed now."""
    delivery, stamp = headers.get("x-portal-delivery", ""), headers.get("x-portal-timestamp", "")
    if not delivery or not stamp.isdigit():
        return "no delivery id or timestamp"
    if abs((time.time() if now is None else now) - int(stamp)) > TOLERANCE_SECONDS:
        return "timestamp outside the tolerance"
    signed = f"{delivery}.{stamp}.".encode() + body
    expected = "v1=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(given.strip(), expected) for given in headers.get("x-portal-signature", "").split(",")):
        return "bad signature"
    return ""


def events(requests: list[dict]) -> dict[str, dict]:
    """The posted events by state, each checked for its signature."""
    found = {}
    for request in requests:
        assert signature_problem(request["headers"], request["body"]) == ""
        assert request["headers"]["content-type"] == "application/json"
        event = json.loads(request["body"])
        found[event["state"]] = event
    return found


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(**kwargs) -> Receiver:
        made.append(Receiver(**kwargs))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def drain(redis_server, settings):
    """A notify queue (and retry set) of this test's own, which no node agent
    serves; returns a function that works it in this process until empty."""
    settings.PAI_INSTANCE = f"pai-test-notify-{uuid.uuid4().hex[:8]}"

    def work() -> None:
        worker = SimpleWorker([queues.notify_queue_name()], connection=queues.connection())
        worker.work(burst=True, with_scheduler=False, logging_level="WARNING")

    yield work
    redis = queues.connection()
    for key in redis.keys(f"*{settings.PAI_INSTANCE}*"):
        redis.delete(key)


def triggers(event: dict) -> tuple:
    """A jobStateChanged event's appExitTrigger* (as the job status has them)."""
    return event["appExitTriggerMessage"], event["appExitTriggerTaskRoleName"], event["appExitTriggerTaskIndex"]


def notify_depth() -> int:
    return queues.connection().llen(f"rq:queue:{queues.notify_queue_name()}")


def waiting_job(owner, **top):
    return submit(owner, config(f"nt-{uuid.uuid4().hex[:8]}", role(gpus=NEVER_FITS_GPUS, command="sleep 1"), **top))


# ------------------------------------------------------------ the seams


def test_it_signs_the_delivery_id_the_timestamp_and_the_raw_body_with_hmac_sha256():
    """Finding 29: a signature of the body alone let a captured delivery be
    sent again, at any time, under any delivery id (a receiver dropping
    repeats by id took it for new)."""
    body = b'{"event":"jobStateChanged"}'
    headers = webhooks.signed_headers(delivery_id="42", body=body, secret="k" * 16, now=1700000000.9)
    assert headers == {
        "X-Portal-Delivery": "42", "X-Portal-Timestamp": "1700000000",
        "X-Portal-Signature": "v1=" + hmac.new(b"k" * 16, b"42.1700000000." + body, hashlib.sha256).hexdigest()}
    assert signature_problem({k.lower(): v for k, v in headers.items()}, body, "k" * 16, now=1700000100) == ""


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "255.255.255.255", "224.0.0.1", "::1", "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "2002:7f00:1::1", "::",
    # NAT64: where the network has such a route, these reach the metadata service and a private host.
    "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b:1::808:808",
])
def test_the_default_refuses_loopback_private_link_local_and_metadata_addresses(address):
    assert not webhooks.address_allowed(ipaddress.ip_address(address), ["public"])


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8",
                                     "64:ff9b::808:808"])
def test_the_default_allows_public_addresses(address):
    assert webhooks.address_allowed(ipaddress.ip_address(address), ["public"])


def test_listed_networks_replace_the_default():
    allowed = ["127.0.0.0/8", "10.20.0.0/16"]
    assert webhooks.address_allowed(ipaddress.ip_address("127.0.0.5"), allowed)
    assert webhooks.address_allowed(ipaddress.ip_address("::ffff:10.20.1.1"), allowed)
    assert not webhooks.address_allowed(ipaddress.ip_address("10.21.0.1"), allowed)
    assert not webhooks.address_allowed(ipaddress.ip_address("8.8.8.8"), allowed)
    assert webhooks.address_allowed(ipaddress.ip_address("8.8.8.8"), ["public", *allowed])


@pytest.mark.parametrize("url, problem", [
    ("ftp://example.org/x", "http:// or https://"), ("http://user:pw@example.org/", "user name or password"),
    ("http://example.org:99999/", "port"), ("http:///nohost", "no host"), ("http://exa mple.org/", "spaces"),
    ("https://example.org/" + "x" * 2000, "longer than"),
])
def test_it_refuses_urls_it_cannot_deliver_to(url, problem):
    with pytest.raises(ValueError, match=problem):
        webhooks.parse_url(url)


def test_the_portals_default_is_public_addresses_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WEBHOOK_ALLOWED_NETWORKS" and not k.startswith("DJANGO_")}
    env.update(PORTAL_VAR_DIR=str(tmp_path), PORTAL_SECRET_KEY="k" * 50)
    shown = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                            "from django.conf import settings; print(settings.WEBHOOK_ALLOWED_NETWORKS)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert shown.stdout.strip().splitlines()[-1] == "['public']", shown.stderr
    env["WEBHOOK_ALLOWED_NETWORKS"] = "10.0.0.0/8,nonsense"
    refused = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode != 0 and "WEBHOOK_ALLOWED_NETWORKS: 'nonsense' is not a CIDR" in refused.stderr


# --------------------------------------------------- delivering to a real receiver


def test_a_loopback_receiver_is_refused_by_default_and_reached_when_allowed(receiver, settings):
    hook = receiver()
    body, headers = b"{}", webhooks.signed_headers(delivery_id="1", body=b"{}", secret=SECRET)
    for url in (hook.url, hook.url.replace("127.0.0.1", "localhost")):
        refused = webhooks.post(url, body, headers, networks=["public"], timeout=5)
        assert (refused.delivered, refused.refused, refused.retry) == (False, True, False)
        assert "outside the networks webhooks may reach" in refused.message
    assert hook.requests == []

    # The test processes allow 127.0.0.0/8; "localhost" is resolved once and
    # its allowed address (127.0.0.1, not ::1) is the one connected to.
    assert settings.WEBHOOK_ALLOWED_NETWORKS == ["127.0.0.0/8"]
    for url in (hook.url, hook.url.replace("127.0.0.1", "localhost")):
        sent = webhooks.post(url, body, headers, networks=settings.WEBHOOK_ALLOWED_NETWORKS, timeout=5)
        assert (sent.delivered, sent.status) == (True, 200), sent.message
    assert [r["path"] for r in hook.requests] == ["/hook?team=7"] * 2
    assert hook.requests[1]["headers"]["host"] == f"localhost:{hook.server.server_port}"


def test_it_follows_no_redirect(receiver):
    target = receiver()
    hook = receiver(statuses=(302,), location=target.url)
    outcome = webhooks.post(hook.url, b"{}", {}, networks=["127.0.0.0/8"], timeout=5)
    assert (outcome.delivered, outcome.retry, outcome.status) == (False, False, 302)
    assert "redirects are not followed" in outcome.message
    assert len(hook.requests) == 1 and target.requests == []


def test_a_slow_receiver_is_given_up_at_the_timeout(receiver):
    hook = receiver(delay=3.0)
    started = time.monotonic()
    outcome = webhooks.post(hook.url, b"{}", {}, networks=["127.0.0.0/8"], timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert (outcome.delivered, outcome.retry) == (False, True) and "no answer within 0.5 s" in outcome.message


def test_a_name_server_that_never_answers_is_given_up_at_the_timeout(monkeypatch):
    # getaddrinfo has no timeout of its own; the receiver's owner may run the
    # name server of the receiver's domain. The lookup shares the deadline.
    def slow_lookup(*args, **kwargs):
        time.sleep(3)
        raise OSError("too late")

    monkeypatch.setattr(webhooks.socket, "getaddrinfo", slow_lookup)
    started = time.monotonic()
    outcome = webhooks.post("http://hooks.example.org/", b"{}", {}, networks=["public"], timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert (outcome.delivered, outcome.retry) == (False, True)
    assert "cannot resolve hooks.example.org: no answer within 0.5 s" in outcome.message


def test_a_node_agents_worker_hands_deliveries_over_and_never_waits_on_a_receiver(drain, alice, monkeypatch):
    # The agent's one RQ worker also launches and stops its node's tasks: a
    # receiver that never answers must not hold it. Here the receiver holds
    # the connection until the test lets it go; the worker is long done by then.
    from types import SimpleNamespace

    from jobs.node import agent
    from jobs.node.notifier import NotificationSender

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    sender = NotificationSender(threads=1)
    monkeypatch.setattr(agent, "_current", SimpleNamespace(notifier=sender))
    notifications.webhook_set(user=alice, url=f"http://127.0.0.1:{listener.getsockname()[1]}/", secret=SECRET)
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()  # the worker's part: hand the event over
    wait_for(lambda: held, timeout=30, what="the receiver's connection")
    delivery = NotificationDelivery.objects.get(user=alice)
    assert delivery.status == Status.SENDING  # under way on the sender's thread, the worker free
    held[0].close()
    listener.close()
    wait_for(lambda: NotificationDelivery.objects.get(pk=delivery.pk).status != Status.SENDING, timeout=30,
             what="the delivery's outcome")
    assert NotificationDelivery.objects.get(pk=delivery.pk).status == Status.RETRYING
    sender.stop()


def test_an_event_waiting_on_a_stopping_agents_threads_is_already_stored_for_the_repair_sweep(drain, alice,
                                                                                             monkeypatch):
    # The agent's threads are busy with another delivery of Alice's when her
    # job's event is handed over, and the agent stops before it is tried: its
    # delivery row must already be stored, PENDING, for the repair sweep.
    from types import SimpleNamespace

    from jobs.node import agent
    from jobs.node.notifier import NotificationSender

    sender = NotificationSender(threads=1)
    monkeypatch.setattr(agent, "_current", SimpleNamespace(notifier=sender))
    notifications.webhook_set(user=alice, url="http://127.0.0.1:9/", secret=SECRET)
    busy, release = threading.Event(), threading.Event()
    sender.submit(lambda: (busy.set(), release.wait(30)), owner=alice.pk)
    assert busy.wait(30)
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()  # the worker hands the event over; it waits behind the busy thread
    sender.stop()
    release.set()
    sender.stop(wait=True)
    delivery = NotificationDelivery.objects.get(user=alice)
    assert (delivery.status, delivery.tries, delivery.payload["state"]) == (Status.PENDING, 0, "STOPPED")
    later = timezone.now() + timedelta(seconds=notifications.REPAIR_GRACE_SECONDS + 1)
    assert delivery.pk in notifications.deliveries_repair(now=later, force=True)


def test_the_sender_takes_a_waiting_delivery_once_and_drops_what_waits_when_stopped():
    from jobs.node.notifier import NotificationSender

    sender = NotificationSender(threads=1)
    busy, release, ran = threading.Event(), threading.Event(), []

    def hold() -> None:
        busy.set()
        release.wait(30)

    sender.submit(hold)
    assert busy.wait(30)
    for _ in range(3):
        sender.submit(ran.append, 7)  # the repair sweep asking again for one still waiting
    sender.submit(ran.append, 8)
    release.set()
    wait_for(lambda: len(ran) == 2, timeout=30, what="the waiting deliveries")
    assert sorted(ran) == [7, 8]

    busy.clear(), release.clear()
    sender.submit(hold)
    assert busy.wait(30)
    sender.submit(ran.append, 9)
    sender.stop()
    release.set()
    sender.stop(wait=True)  # the try under way ends; what waited was dropped
    assert 9 not in ran


def test_one_owners_stalled_deliveries_take_one_thread_and_leave_the_rest_to_others():
    # Alice's receiver never answers: her deliveries go one at a time, in
    # order, and Bob's goes out on another thread meanwhile.
    from jobs.node.notifier import NotificationSender

    sender = NotificationSender(threads=3)
    release, started, done = threading.Event(), [], []
    lock = threading.Lock()

    def stalled(number: int) -> None:
        with lock:
            started.append(number)
        release.wait(30)
        done.append(number)

    for number in (1, 2, 3):
        sender.submit(stalled, number, owner=7)
    bob = threading.Event()
    sender.submit(bob.set, owner=8)
    assert bob.wait(30)  # not behind Alice's
    wait_for(lambda: started, timeout=30, what="Alice's first delivery")
    assert started == [1]  # one thread for her, however many of hers wait
    release.set()
    wait_for(lambda: len(done) == 3, timeout=30, what="Alice's deliveries, in turn")
    assert done == [1, 2, 3]
    sender.stop(wait=True)


def test_a_closed_port_is_worth_another_try():
    outcome = webhooks.post(f"http://127.0.0.1:{free_port()}/", b"{}", {}, networks=["127.0.0.0/8"], timeout=2)
    assert (outcome.delivered, outcome.retry) == (False, True) and "cannot connect" in outcome.message


# ------------------------------------------------ state changes, through the services


def test_running_and_succeeded_reach_the_webhook_signed_after_commit(drain, receiver, alice, node):
    hook = receiver()
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    job = gpu_job(alice, node)
    task = start(job)["main-0"]
    assert exit_(task, 0)
    # Nothing is sent inside a state change: it is only enqueued. (RUNNING
    # may have come already: a test cluster's agent may place the job.)
    assert State.SUCCEEDED not in {json.loads(r["body"])["state"] for r in hook.requests}
    assert notify_depth() >= 1
    drain()

    sent = events(hook.wait(2))
    assert set(sent) == {State.RUNNING, State.SUCCEEDED}
    job.refresh_from_db()
    assert sent[State.SUCCEEDED] == {
        "event": "jobStateChanged", "job": f"{alice.username}~{job.name}", "jobName": job.name,
        "user": alice.username, "state": "SUCCEEDED", "previousState": "RUNNING", "exitReason": "all tasks succeeded",
        "appExitTriggerMessage": "all tasks completed: 1 of 1 succeeded", "appExitTriggerTaskRoleName": "main",
        "appExitTriggerTaskIndex": 0, "time": sent[State.SUCCEEDED]["time"], "url": f"/jobs/{job.pk}/",
    }
    assert sent[State.RUNNING]["previousState"] == "WAITING" and sent[State.RUNNING]["exitReason"] is None
    assert triggers(sent[State.RUNNING]) == (None, None, None)  # nothing has ended it
    finished = datetime.fromisoformat(sent[State.SUCCEEDED]["time"].replace("Z", "+00:00"))
    assert abs((finished - job.finished_at).total_seconds()) < 0.01
    delivered = NotificationDelivery.objects.filter(user=alice, job=job)
    assert sorted(delivered.values_list("payload__state", "status", "tries", "response_code")) == [
        ("RUNNING", Status.DELIVERED, 1, 200), ("SUCCEEDED", Status.DELIVERED, 1, 200)]


def test_failed_and_stopped_carry_their_reasons(drain, receiver, alice, node):
    hook = receiver()
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    failing = gpu_job(alice, node)
    assert exit_(start(failing)["main-0"], 3)
    waiting = waiting_job(alice)
    services.job_stop(job=waiting, by=alice)
    drain()

    by_job: dict[str, dict] = {}
    for request in hook.wait(3):
        event = events([request])
        for state, body in event.items():
            by_job.setdefault(body["jobName"], {})[state] = body
    assert by_job[failing.name][State.FAILED]["exitReason"] == "task main-0 failed: the command exited with code 3"
    assert by_job[failing.name][State.FAILED]["previousState"] == "RUNNING"
    assert list(by_job[waiting.name]) == [State.STOPPED]
    stopped = by_job[waiting.name][State.STOPPED]
    assert (stopped["previousState"], stopped["exitReason"]) == ("WAITING", f"stopped by {alice.username}")


def test_a_job_ended_by_a_rule_sends_the_task_that_fired_it_to_its_owner_only(drain, receiver, alice, bob, node):
    hook, bobs = receiver(), receiver()
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    notifications.webhook_set(user=bob, url=bobs.url, secret=SECRET)
    job = gpu_job(alice, node, role(tasks=3))
    tasks = start(job)
    assert exit_(tasks["main-0"], 0) and exit_(tasks["main-2"], 3)
    drain()

    failed = events(hook.wait(2))[State.FAILED]  # signed, as every event
    assert triggers(failed) == ("minFailedTaskCount 1 of role main reached: 1 task failed", "main", 2)
    assert failed["exitReason"] == "task main-2 failed: the command exited with code 3"  # as before
    # Bob hears nothing of Alice's job, and his Profile page shows none of it.
    assert bobs.requests == []
    bob_client = Client()
    bob_client.force_login(bob)
    assert job.name not in bob_client.get("/profile/").content.decode()
    assert Client().get("/profile/")["Location"].startswith("/login/")


def test_a_stop_sends_who_stopped_the_job_and_no_task(drain, receiver, alice, node):
    hook = receiver()
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    stopped, reclaimed = gpu_job(alice, node, role(tasks=2)), gpu_job(alice, node, role(tasks=2))
    stopped_tasks, reclaimed_tasks = start(stopped), start(reclaimed)
    services.job_stop(job=stopped, by=alice)
    assert lifecycle.job_reclaim_idle_gpus(job_id=reclaimed.pk, number=1)
    for task in (*stopped_tasks.values(), *reclaimed_tasks.values()):
        assert exit_(task, 137)
    drain()

    by_job = {}
    for request in hook.wait(4):
        for state, body in events([request]).items():
            by_job[(body["jobName"], state)] = body
    assert triggers(by_job[(stopped.name, State.STOPPED)]) == (f"stopped by {alice.username}", None, None)
    assert triggers(by_job[(reclaimed.name, State.STOPPED)]) == (lifecycle.IDLE_GPUS_TRIGGER.message, None, None)


def test_a_receiver_that_checks_as_documented_refuses_a_captured_delivery_replayed(drain, receiver, alice):
    """Finding 29, at a real receiver on loopback that verifies as README
    says and remembers the delivery ids it took within its tolerance: the
    portal's delivery passes; the same bytes sent again under another
    delivery id, with another timestamp, or later than the tolerance are
    refused, and under its own id it is a repeat, acknowledged, not acted on."""
    taken: list[str] = []
    repeats: list[str] = []

    def judge(headers: dict, body: bytes) -> int:
        if signature_problem(headers, body):
            return 401
        (repeats if headers["x-portal-delivery"] in taken else taken).append(headers["x-portal-delivery"])
        return 200

    hook = receiver(judge=judge)
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()
    delivery = NotificationDelivery.objects.get(user=alice)
    assert (delivery.status, delivery.response_code) == (Status.DELIVERED, 200)
    captured = hook.wait(1)[0]
    assert taken == [str(delivery.pk)]

    def replay(**changed: str) -> webhooks.Outcome:
        headers = {"X-Portal-Delivery": captured["headers"]["x-portal-delivery"],
                   "X-Portal-Timestamp": captured["headers"]["x-portal-timestamp"],
                   "X-Portal-Signature": captured["headers"]["x-portal-signature"], **changed}
        return webhooks.post(hook.url, captured["body"], headers, networks=["127.0.0.0/8"], timeout=5)

    assert replay(**{"X-Portal-Delivery": str(delivery.pk + 1000)}).status == 401
    assert replay(**{"X-Portal-Timestamp": str(int(time.time()) + 60)}).status == 401
    assert replay().status == 200 and repeats == [str(delivery.pk)]
    # Captured long ago, signed then: refused whatever its id.
    old = webhooks.signed_headers(delivery_id="7777", body=captured["body"], secret=SECRET,
                                  now=time.time() - 2 * TOLERANCE_SECONDS)
    assert webhooks.post(hook.url, captured["body"], old, networks=["127.0.0.0/8"], timeout=5).status == 401
    assert taken == [str(delivery.pk)]


def test_a_user_without_a_webhook_costs_no_queued_work(drain, alice, bob, receiver):
    notifications.webhook_set(user=bob, url=receiver().url, secret=SECRET)  # someone else's
    services.job_stop(job=waiting_job(alice), by=alice)
    assert notify_depth() == 0
    services.job_stop(job=waiting_job(bob), by=bob)
    assert notify_depth() == 1


def test_a_rolled_back_change_tells_no_one(drain, receiver, alice):
    from django.db import transaction

    notifications.webhook_set(user=alice, url=receiver().url, secret=SECRET)
    job = waiting_job(alice)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.job_stop(job=job, by=alice)
        raise RuntimeError("the caller's transaction fails after the stop")
    assert notify_depth() == 0
    job.refresh_from_db()
    assert job.state == State.WAITING


def test_a_failed_delivery_is_tried_again_after_its_wait(drain, receiver, alice, settings):
    # Judged at given moments, not by sleeping past a short wait: on a
    # loaded machine the first try's bookkeeping took longer than 0.3 s, and
    # "not due yet" no longer held when it was asked.
    settings.WEBHOOK_RETRY_SECONDS = [60]
    hook = receiver(statuses=(503,))
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    services.job_stop(job=waiting_job(alice), by=alice)
    before = time.time()
    drain()
    delivery = NotificationDelivery.objects.get(user=alice)
    assert (delivery.status, delivery.tries, delivery.response_code) == (Status.RETRYING, 1, 503)
    assert delivery.next_try_at > timezone.now() + timedelta(seconds=50)

    assert queues.enqueue_due_notifications(now=before + 59) == 0  # not due before its wait
    # A minute passes: in the database (a try is taken only when due) and in Redis.
    NotificationDelivery.objects.filter(pk=delivery.pk).update(next_try_at=timezone.now() - timedelta(seconds=1))
    assert queues.enqueue_due_notifications(now=time.time() + 61) == 1
    assert queues.enqueue_due_notifications(now=time.time() + 61) == 0  # taken once, whoever asks
    drain()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.tries, delivery.response_code, delivery.next_try_at) == (
        Status.DELIVERED, 2, 200, None)
    first, second = hook.wait(2)
    assert first["body"] == second["body"]
    assert first["headers"]["x-portal-delivery"] == second["headers"]["x-portal-delivery"] == str(delivery.pk)
    # Each try is signed when it is made: a retry hours later is within a receiver's tolerance.
    assert signature_problem(second["headers"], second["body"]) == ""
    assert int(second["headers"]["x-portal-timestamp"]) >= int(first["headers"]["x-portal-timestamp"])


def test_a_receiver_that_is_down_costs_one_try_per_wait_however_many_events(drain, receiver, alice, bob, settings):
    # Alice's receiver never answers within the timeout: her first delivery
    # is tried and waits; the next ones wait behind it untried (no thread
    # held for them), and go out after it once the receiver answers. Bob's
    # receiver is not affected.
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    settings.WEBHOOK_RETRY_SECONDS = [60, 60]
    down = receiver(delay=3)
    notifications.webhook_set(user=alice, url=down.url, secret=SECRET)
    bobs = receiver()
    notifications.webhook_set(user=bob, url=bobs.url, secret=SECRET)
    for _ in range(3):
        services.job_stop(job=waiting_job(alice), by=alice)
    services.job_stop(job=waiting_job(bob), by=bob)
    drain()
    assert len(down.requests) == 1
    first = NotificationDelivery.objects.get(user=alice, tries=1)
    held = list(NotificationDelivery.objects.filter(user=alice).exclude(pk=first.pk))
    assert len(held) == 2
    assert (first.status, first.tries, first.result) == (Status.RETRYING, 1, "no answer within 0.5 s")
    for delivery in held:  # due a try's length (timeout and a margin) after the failed one
        assert (delivery.status, delivery.tries) == (Status.RETRYING, 0)
        assert delivery.next_try_at == first.next_try_at + timedelta(seconds=0.5 + notifications.HOLD_MARGIN_SECONDS)
        assert delivery.result.startswith(f"not tried yet: this webhook did not take delivery {first.pk} (")
    assert NotificationDelivery.objects.get(user=bob).status == Status.DELIVERED

    down.delay = 0  # the receiver answers again
    # A minute and the held ones' margin pass: in the database (when they
    # are due) and in Redis.
    NotificationDelivery.objects.filter(user=alice).update(next_try_at=timezone.now() - timedelta(seconds=1))
    assert queues.enqueue_due_notifications(now=time.time() + 63) == 3
    drain()
    tries = dict(NotificationDelivery.objects.filter(user=alice, status=Status.DELIVERED).values_list("id", "tries"))
    assert tries == {first.pk: 2, **{delivery.pk: 1 for delivery in held}}
    assert len(down.requests) == 4


def test_it_gives_up_after_the_last_wait_and_never_retries_a_refusal(drain, receiver, alice, settings):
    settings.WEBHOOK_RETRY_SECONDS = [0.0]
    hook = receiver(statuses=(500, 500))
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()
    assert queues.enqueue_due_notifications() == 1
    drain()
    delivery = NotificationDelivery.objects.get(user=alice)
    assert (delivery.status, delivery.tries) == (Status.FAILED, 2)
    assert delivery.result == "HTTP 500 (gave up after 2 tries)"

    settings.WEBHOOK_ALLOWED_NETWORKS = ["public"]  # the default: loopback is refused
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()
    refused = NotificationDelivery.objects.filter(user=alice).order_by("-id").first()
    assert (refused.status, refused.tries, refused.next_try_at) == (Status.REFUSED, 1, None)
    assert "outside the networks webhooks may reach" in refused.result
    assert queues.enqueue_due_notifications() == 0 and len(hook.requests) == 2


# ------------------------------------------------------------------ e-mail


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], email.message.Message]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's name)
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp(settings):
    """A real SMTP server on a free 127.0.0.1 port, and the portal pointed at it."""
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    try:
        yield inbox
    finally:
        controller.stop()


def with_email(user):
    user.email = f"{user.username}@example.org"
    user.save(update_fields=["email"])
    return user


def test_it_emails_the_states_a_user_opted_in_to(drain, smtp, alice, node):
    with_email(alice)
    notifications.email_states_set(user=alice, states=[State.SUCCEEDED, State.FAILED])
    job = gpu_job(alice, node)
    assert exit_(start(job)["main-0"], 0)
    drain()
    wait_for(lambda: smtp.messages, what="an e-mail")
    [(recipients, message)] = smtp.messages  # RUNNING was not asked for
    assert recipients == [alice.email]
    assert message["Subject"] == f"Job {alice.username}~{job.name} is succeeded"
    assert message["Auto-Submitted"] == "auto-generated"
    assert "went from RUNNING to SUCCEEDED" in message.get_payload() and f"/jobs/{job.pk}/" in message.get_payload()
    delivery = NotificationDelivery.objects.get(user=alice, channel=NotificationDelivery.Channel.EMAIL)
    assert (delivery.status, delivery.target) == (Status.DELIVERED, alice.email)


def test_a_v1_config_asks_for_email_with_extras(drain, smtp, alice, node):
    with_email(alice)  # and no choice made on the Profile page
    job = gpu_job(alice, node, extras={"jobStatusChangeNotification": {"running": False, "failed": True}})
    assert exit_(start(job)["main-0"], 2)
    drain()
    wait_for(lambda: smtp.messages, what="an e-mail")
    assert [message["Subject"] for _to, message in smtp.messages] == [f"Job {alice.username}~{job.name} is failed"]
    assert "Reason: task main-0 failed: the command exited with code 2" in smtp.messages[0][1].get_payload()


def test_a_v2_config_asks_for_email_with_extras(drain, smtp, alice):
    with_email(alice)
    name = f"v2mail-{uuid.uuid4().hex[:8]}"
    job = submit(alice, f"""protocolVersion: 2
name: {name}
type: job
prerequisites:
  - {{name: img, type: dockerimage, uri: pai-local/busybox:latest}}
taskRoles:
  main:
    instances: 1
    dockerImage: img
    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: {NEVER_FITS_GPUS}}}
    commands: ["sleep 1"]
extras:
  jobStatusChangeNotification: {{stopped: true}}
""")
    assert job.spec.extras["jobStatusChangeNotification"] == {"stopped": True}
    services.job_stop(job=job, by=alice)
    drain()
    wait_for(lambda: smtp.messages, what="an e-mail")
    assert [message["Subject"] for _to, message in smtp.messages] == [f"Job {alice.username}~{name} is stopped"]


def test_the_email_says_which_task_ended_the_job_in_one_line(drain, smtp, alice, node):
    with_email(alice)
    notifications.email_states_set(user=alice, states=[State.FAILED])
    job = gpu_job(alice, node, role(tasks=3))
    assert exit_(start(job)["main-1"], 3)
    drain()
    wait_for(lambda: smtp.messages, what="an e-mail")
    [(_to, message)] = smtp.messages
    lines = message.get_payload().splitlines()
    assert "Reason: task main-1 failed: the command exited with code 3" in lines
    assert "Ended by: task main-1 (minFailedTaskCount 1 of role main reached: 1 task failed)" in lines


def test_the_email_of_a_stop_names_who_stopped_it_once_and_no_task(drain, smtp, alice, node):
    with_email(alice)
    notifications.email_states_set(user=alice, states=[State.STOPPED])
    stopped, reclaimed = gpu_job(alice, node), gpu_job(alice, node)
    stopped_task, reclaimed_task = start(stopped)["main-0"], start(reclaimed)["main-0"]
    services.job_stop(job=stopped, by=alice)
    assert exit_(stopped_task, 137)
    drain()
    wait_for(lambda: smtp.messages, what="the stop's e-mail")
    text = smtp.messages[0][1].get_payload()
    # The reason says who; no task is named and nothing is said twice.
    assert f"Reason: stopped by {alice.username}" in text
    assert text.count(f"stopped by {alice.username}") == 1 and "Ended" not in text and "task " not in text

    # The platform's reclaim says more in its trigger than in its reason.
    assert lifecycle.job_reclaim_idle_gpus(job_id=reclaimed.pk, number=1)
    assert exit_(reclaimed_task, 137)
    drain()
    wait_for(lambda: len(smtp.messages) == 2, what="the reclaim's e-mail")
    lines = smtp.messages[1][1].get_payload().splitlines()
    assert "Reason: idle GPUs reclaimed" in lines
    assert f"Ended: {lifecycle.IDLE_GPUS_TRIGGER.message}" in lines


def test_an_event_or_delivery_from_before_triggers_were_sent_still_goes_out():
    # Queued by a portal of the previous version: no trigger in the event.
    event = {"job_id": 1, "owner_id": 1, "job_name": "old", "state": "FAILED", "previous": "RUNNING",
             "reason": "task main-0 failed", "time": "2026-11-29T10:00:00.000Z"}
    payload = notifications._payload(event, "alice")
    assert triggers(payload) == (None, None, None)
    # Stored by it, tried again now: no trigger keys in the payload at all.
    old_payload = {k: v for k, v in payload.items() if not k.startswith("appExitTrigger")}
    for each in (payload, old_payload):
        text = notifications._email_text(each)
        assert "Reason: task main-0 failed" in text and "Ended" not in text


def test_no_smtp_server_means_no_email_and_no_queued_work(drain, alice, settings):
    settings.EMAIL_HOST = ""
    with_email(alice)
    notifications.email_states_set(user=alice, states=[State.STOPPED])
    services.job_stop(job=waiting_job(alice, extras={"jobStatusChangeNotification": True}), by=alice)
    assert notify_depth() == 0


def test_an_smtp_server_that_is_down_is_tried_again(drain, alice, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", free_port(), 2
    with_email(alice)
    notifications.email_states_set(user=alice, states=[State.STOPPED])
    services.job_stop(job=waiting_job(alice), by=alice)
    drain()
    delivery = NotificationDelivery.objects.get(user=alice)
    assert (delivery.channel, delivery.status) == (NotificationDelivery.Channel.EMAIL, Status.RETRYING)
    assert delivery.result.startswith("SMTP failed")


# ------------------------------------------------------------ the Profile page


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_profile_page_sets_and_removes_a_webhook(alice):
    client = logged_in(alice)
    page = client.get("/profile/")
    assert page.status_code == 200 and 'id="notifications"' in page.content.decode()
    answer = client.post("/profile/notifications/webhook/", {"url": "https://hooks.example.org/x", "secret": SECRET})
    assert answer.status_code == 302 and answer["Location"] == "/profile/#notifications"
    row = NotificationSettings.objects.get(user=alice)
    assert row.webhook_url == "https://hooks.example.org/x" and SECRET not in row.webhook_secret_sealed
    shown = client.get("/profile/").content.decode()
    assert "https://hooks.example.org/x" in shown and SECRET not in shown

    # An empty secret keeps the one set before; a bad URL changes nothing.
    client.post("/profile/notifications/webhook/", {"url": "https://hooks.example.org/y", "secret": ""})
    row.refresh_from_db()
    assert row.webhook_url == "https://hooks.example.org/y" and row.webhook_secret_sealed
    bad = client.post("/profile/notifications/webhook/", {"url": "http://10.0.0.1/x", "secret": ""}, follow=True)
    assert "outside the networks webhooks may reach" in bad.content.decode()
    assert NotificationSettings.objects.get(user=alice).webhook_url == "https://hooks.example.org/y"
    # The refused URL comes back in the box to be mended (once), not lost.
    assert 'value="http://10.0.0.1/x"' in bad.content.decode()
    assert 'value="https://hooks.example.org/y"' in client.get("/profile/").content.decode()

    client.post("/profile/notifications/webhook/delete/")
    assert NotificationSettings.objects.get(user=alice).webhook_url == ""


def test_the_profile_page_saves_email_choices_and_lists_the_latest_20_deliveries(alice, settings):
    settings.EMAIL_HOST = "127.0.0.1"
    client = logged_in(alice)
    client.post("/profile/notifications/email/", {"states": ["FAILED", "STOPPED", "BOGUS"]})
    assert NotificationSettings.objects.get(user=alice).email_states == ["FAILED", "STOPPED"]
    NotificationDelivery.objects.bulk_create([
        NotificationDelivery(user=alice, channel="webhook", status=Status.DELIVERED, result="HTTP 204",
                             payload={"job": f"{alice.username}~j{i}x", "state": "FAILED"},
                             target="https://hooks.example.org/")
        for i in range(25)])
    page = client.get("/profile/").content.decode()
    assert 'value="FAILED" checked' in page and 'value="RUNNING">' in page
    shown = [i for i in range(25) if f"~j{i}x<" in page]
    assert shown == list(range(5, 25))


def test_nobody_sees_or_changes_another_users_notifications(alice, bob):
    notifications.webhook_set(user=alice, url="https://hooks.example.org/alice", secret=SECRET)
    NotificationDelivery.objects.create(user=alice, channel="webhook", payload={"job": "alice~secretjob",
                                        "state": "FAILED"}, target="https://hooks.example.org/alice")
    page = logged_in(bob).get("/profile/").content.decode()
    assert "hooks.example.org/alice" not in page and "secretjob" not in page
    logged_in(bob).post("/profile/notifications/webhook/delete/")
    assert NotificationSettings.objects.get(user=alice).webhook_url == "https://hooks.example.org/alice"

    anonymous = Client()
    for method, path in (("get", "/profile/"), ("post", "/profile/notifications/webhook/"),
                         ("post", "/profile/notifications/webhook/delete/"), ("post", "/profile/notifications/email/")):
        answer = getattr(anonymous, method)(path, {"url": "https://evil.example.org/", "secret": SECRET})
        assert answer.status_code == 302 and answer["Location"].startswith("/login/"), path
    assert NotificationSettings.objects.get(user=alice).webhook_url == "https://hooks.example.org/alice"


# ------------------------------------------------------------------ the REST API


def bearer(user) -> dict[str, str]:
    made = tokens.token_create(user=user, lifetime=timedelta(hours=1), label="test")
    return {"HTTP_AUTHORIZATION": f"Bearer {made.key}"}


def call(method: str, path: str, headers: dict[str, str], body: dict | None = None):
    client = Client()
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if method == "put" else {}
    return getattr(client, method)(path, **kwargs, **headers)


def test_the_api_sets_shows_and_removes_ones_own_webhook(alice):
    path, auth = f"/api/v1/user/{alice.username}/webhook", bearer(alice)
    assert call("get", path, auth).json() == {"url": None}
    answer = call("put", path, auth, {"url": "https://hooks.example.org/a", "secret": SECRET})
    assert answer.status_code == 200 and answer.json() == {"url": "https://hooks.example.org/a"}
    assert call("get", path, auth).json() == {"url": "https://hooks.example.org/a"}  # never the secret
    for body, words in (({"url": "https://hooks.example.org/a"}, "secret is required"),
                        ({"url": "https://hooks.example.org/a", "secret": "short"}, "16 to 256"),
                        ({"url": "http://169.254.169.254/latest", "secret": SECRET}, "outside the networks"),
                        ({"url": "gopher://x/", "secret": SECRET}, "http:// or https://")):
        refused = call("put", path, auth, body)
        assert refused.status_code == 400 and refused.json()["code"] == "InvalidParametersError"
        assert words in refused.json()["message"]
    assert call("delete", path, auth).json() == {"message": "webhook removed"}
    assert call("get", path, auth).json() == {"url": None}


def test_the_api_lets_only_the_owner_and_admins_near_a_webhook(alice, bob, admin_user):
    notifications.webhook_set(user=alice, url="https://hooks.example.org/alice", secret=SECRET)
    path = f"/api/v1/user/{alice.username}/webhook"
    for method in ("get", "put", "delete"):
        as_bob = call(method, path, bearer(bob), {"url": "https://evil.example.org/", "secret": SECRET})
        assert (as_bob.status_code, as_bob.json()["code"]) == (403, "ForbiddenUserError")
        anonymous = call(method, path, {}, {"url": "https://evil.example.org/", "secret": SECRET})
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "UnauthorizedUserError")
    # Another user, named or not, gets the same answer.
    assert call("get", "/api/v1/user/nobody_here/webhook", bearer(bob)).status_code == 403
    assert NotificationSettings.objects.get(user=alice).webhook_url == "https://hooks.example.org/alice"

    admin = bearer(admin_user)
    assert call("get", path, admin).json() == {"url": "https://hooks.example.org/alice"}
    assert call("put", path, admin, {"url": "https://hooks.example.org/b", "secret": SECRET}).status_code == 200
    assert call("get", "/api/v1/user/nobody_here/webhook", admin).json()["code"] == "NoUserError"


# ------------------------------------------------------- the real cluster, end to end


@pytest.mark.services
def test_a_real_jobs_running_and_succeeded_reach_the_receiver_signed(cluster, receiver, alice):
    hook = receiver()
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    job = submit(alice, config(f"hook-{uuid.uuid4().hex[:8]}", role(command="echo notified")))
    wait_state(job, State.SUCCEEDED)
    sent = events(hook.wait(2))
    assert set(sent) == {State.RUNNING, State.SUCCEEDED}
    assert sent[State.SUCCEEDED]["job"] == f"{alice.username}~{job.name}"
    assert sent[State.SUCCEEDED]["exitReason"] == "all tasks succeeded"
    wait_for(lambda: NotificationDelivery.objects.filter(user=alice, job=job, status=Status.DELIVERED).count() == 2,
             what="both deliveries recorded as delivered")


def test_a_delivery_held_behind_a_receiver_that_stays_down_ends_when_its_own_tries_would_have(
        drain, receiver, alice, settings):
    # Held deliveries wait, untried, behind the one that failed; while they
    # wait they are RETRYING, which the pruning of a user's old deliveries
    # keeps. With a receiver that stays down, each waited behind all those
    # before it (one whole retry schedule each), so a user's rows grew with
    # every event for as long as the receiver stayed down. A delivery now
    # ends (FAILED) once it has waited as long as its own tries would have
    # lasted, as it would have, had it been tried.
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    settings.WEBHOOK_RETRY_SECONDS = [0.5]
    down = receiver(statuses=(500,) * 1000)
    notifications.webhook_set(user=alice, url=down.url, secret=SECRET)
    for _ in range(10):
        services.job_stop(job=waiting_job(alice), by=alice)
    # Before, each took a schedule (about 2 s here) after the one before it:
    # 20 s for the last. Now all end within about one budget (3.5 s here).
    budget = notifications.held_delivery_budget().total_seconds()
    deadline = time.monotonic() + budget + 10
    drain()  # the events: a delivery each, the first tried, the others held
    going = NotificationDelivery.objects.filter(user=alice, status__in=(Status.PENDING, Status.SENDING,
                                                                         Status.RETRYING))
    assert going.count() == 10
    while going.exists() and time.monotonic() < deadline:
        queues.enqueue_due_notifications()
        drain()
        time.sleep(0.1)
    assert not going.exists(), list(going.values_list("id", "status", "tries", "result"))
    given_up = NotificationDelivery.objects.filter(user=alice, status=Status.FAILED, tries=0)
    assert given_up.exists() and all("gave up" in result for result in given_up.values_list("result", flat=True))
    # Most were given up untried: far fewer requests than a delivery's two tries each.
    assert len(down.requests) < 10 * 2


def test_two_deliveries_the_receiver_failed_are_both_tried_again_the_older_first(drain, alice, receiver, settings):
    """Both had their first try at once (two agents) and the receiver
    answered 503. Each, when due, found the other waiting with a later time
    and was held behind it: they held each other until both were given up,
    untried, though the receiver answered again a second later. Only an
    older failed delivery holds a newer one."""
    settings.WEBHOOK_RETRY_SECONDS = [1.0, 1.0, 1.0]
    hook = receiver()
    notifications.webhook_set(user=alice, url=hook.url, secret=SECRET)
    payload = notifications._payload({"job_id": 1, "job_name": f"j{uuid.uuid4().hex[:6]}", "state": "RUNNING",
                                      "previous": "WAITING", "reason": "", "time": "2026-05-04T10:11:12.345Z"},
                                     alice.username)
    now = timezone.now()
    ids = [NotificationDelivery.objects.create(
        user=alice, channel="webhook", payload=payload, target=hook.url, status=Status.RETRYING, tries=1,
        next_try_at=now + timedelta(seconds=0.3 + 0.1 * number), result="HTTP 503").pk for number in range(2)]
    deadline = time.monotonic() + notifications.held_delivery_budget().total_seconds() + 5
    while NotificationDelivery.objects.filter(pk__in=ids, status=Status.RETRYING).exists():
        assert time.monotonic() < deadline, list(NotificationDelivery.objects.filter(pk__in=ids).values("status", "result"))
        for delivery_id in NotificationDelivery.objects.filter(
                pk__in=ids, status=Status.RETRYING, next_try_at__lte=timezone.now()).values_list("id", flat=True):
            notifications.delivery_try(delivery_id)  # what the agents do for each due delivery
        time.sleep(0.05)
    assert list(NotificationDelivery.objects.filter(pk__in=ids).order_by("pk").values_list("status", flat=True)) == [
        Status.DELIVERED, Status.DELIVERED]
    assert len(hook.requests) == 2
