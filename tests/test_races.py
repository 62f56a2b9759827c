"""Concurrent actors that used to corrupt state, each forced into the
interleaving that did: a user deleted while submitting, a password changed
while a token is made, SSH keys added at once, a finished job's name
submitted again while the job is deleted, a stop while a task's exit is
recorded, and deliveries to a webhook whose failed delivery is being
retried. Run on SQLite and in the PostgreSQL pass (scripts/test), where
the rows are really locked by concurrent transactions.

Users: alice, bob, an admin; each test makes its own.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from jobs import keys, queues, services, webhooks
from jobs.models import (
    ApiToken,
    Job,
    Node,
    NotificationDelivery,
    NotificationSettings,
    SshKey,
    State,
    TaskAttempt,
    User,
)
from jobs.services import access, job_store, lifecycle, notifications, tokens, users

THREADS = 12
NEVER_FITS_GPUS = 64  # no node has that many: a job here waits until stopped, whatever agents run meanwhile
Status = NotificationDelivery.Status


def _config(name: str, **role: object) -> str:
    return json.dumps({"jobName": name, "image": "pai-local/busybox:latest", **role.pop("top", {}),
                       "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 100,
                                      "gpuNumber": 0, "command": "true", **role}]})


def _in_thread(target: Callable[[], object]) -> tuple[threading.Thread, dict]:
    """Runs `target` on a thread with its own database connection; the dict
    gets its "result" or "error" (the exception)."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = target()
        except Exception as exc:  # noqa: BLE001 -- handed to the test to judge
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _all_at_once(count: int, target: Callable[[int], object]) -> list[dict]:
    barrier = threading.Barrier(count)

    def each(number: int) -> Callable[[], object]:
        def run() -> object:
            barrier.wait()
            return target(number)
        return run

    started = [_in_thread(each(number)) for number in range(count)]
    for thread, _ in started:
        thread.join()
    return [out for _, out in started]


def _until_blocked_on_a_lock(timeout: float = 10.0) -> None:
    """Until another session waits for a row lock (PostgreSQL). SQLite's
    writers wait in BEGIN IMMEDIATE, which nothing shows: the other thread
    is given a moment to get there, and the outcome is judged either way."""
    if connection.vendor != "postgresql":
        time.sleep(0.3)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if someone_waits_for_a_lock():
            return
        time.sleep(0.01)
    raise AssertionError("no session came to wait for the lock")


def someone_waits_for_a_lock(pid: int | None = None) -> bool:
    """Whether another session of this database (or the one of backend
    `pid`) waits for a lock now (PostgreSQL)."""
    whose = "pid = %s" if pid is not None else "pid <> pg_backend_pid()"
    with connection.cursor() as cursor:
        # Inside a transaction PostgreSQL shows the first look again
        # unless its snapshot of the statistics is dropped.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(f"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND {whose} "
                       "AND datname = current_database()", [pid] if pid is not None else [])
        return bool(cursor.fetchone()[0])


# ------------------------------------------------------------------ users


def test_a_user_deleted_while_submitting_leaves_no_accepted_job_behind(make_user, admin_user, redis_server,
                                                                       monkeypatch):
    victim = make_user("victim")
    counted, original_delete = threading.Event(), User.delete

    def delete(self, *args, **kwargs):
        if self.pk == victim.pk:  # counted no unfinished job: the submission comes now
            counted.set()
            _until_blocked_on_a_lock()
        return original_delete(self, *args, **kwargs)

    monkeypatch.setattr(User, "delete", delete)
    deleting, deleted = _in_thread(lambda: users.user_delete(user=User.objects.get(pk=victim.pk), by=admin_user))
    assert counted.wait(10)
    during = _config("during_delete", gpuNumber=NEVER_FITS_GPUS)
    submitting, submitted = _in_thread(lambda: services.job_submit(owner=victim, config=during))
    deleting.join()
    submitting.join()
    assert "error" not in deleted, deleted
    # The submission waited for the delete and was refused cleanly (no 500);
    # nothing it stored outlives its owner.
    error = submitted.get("error")
    assert isinstance(error, services.SubmitError) and error.code == "NoUserError", submitted
    assert not User.objects.filter(pk=victim.pk).exists()
    assert not Job.objects.filter(owner_id=victim.pk).exists()


def test_a_token_asked_for_with_the_old_password_is_not_made_after_a_change(alice, monkeypatch):
    from jobs.api.views import tokens as token_view

    login = token_view.ratelimit.attempt_login

    def login_then_the_password_changes(request, **kwargs):
        user = login(request, **kwargs)  # the old password was right
        thread, out = _in_thread(lambda: users.user_change_password(
            user=User.objects.get(pk=alice.pk), password="brand-new-pw-9876", by=alice,
            current_password=alice.test_password))
        thread.join()
        assert "error" not in out, out
        return user

    monkeypatch.setattr(token_view.ratelimit, "attempt_login", login_then_the_password_changes)
    answer = Client().post("/api/v1/token", json.dumps({"username": alice.username, "password": alice.test_password}),
                           content_type="application/json")
    assert answer.status_code == 400 and "password was changed" in answer.json()["message"], answer.content
    assert not ApiToken.objects.filter(user=alice, revoked_at__isnull=True).exists()


def test_an_admins_password_reset_revokes_the_users_tokens(alice, bob, admin_user):
    held = tokens.token_create(user=alice, lifetime=timedelta(hours=1))
    others = tokens.token_create(user=bob, lifetime=timedelta(hours=1))
    page = f"/admin/jobs/user/{alice.pk}/password/"
    # Neither the user herself (no staff) nor an anonymous client may.
    mine = Client()
    mine.force_login(alice)
    assert mine.get(page).status_code == 302 and Client().get(page).status_code == 302
    admin = Client()
    admin.force_login(admin_user)
    refused = admin.post(page, {"password1": "short", "password2": "different"})
    assert refused.status_code == 200 and tokens.token_authenticate(held.key)  # nothing saved, nothing revoked
    saved = admin.post(page, {"password1": "a-fresh-pass-2468", "password2": "a-fresh-pass-2468"})
    assert saved.status_code == 302
    with pytest.raises(tokens.TokenRejected):
        tokens.token_authenticate(held.key)
    assert tokens.token_authenticate(others.key)  # another user's stay


# --------------------------------------------------------------- SSH keys


def _public_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " t@x"


def test_ssh_keys_added_at_once_stop_at_the_limit_and_never_repeat(alice, bob):
    for number in range(access.MAX_SSH_KEYS_PER_USER - 1):
        SshKey.objects.create(user=alice, title=f"k{number}", public_key="x", fingerprint=f"fp{number}")
    new = [_public_key() for _ in range(THREADS)]
    outcomes = _all_at_once(THREADS, lambda n: access.ssh_key_add(user=alice, title=f"n{n}", public_key=new[n]))
    assert SshKey.objects.filter(user=alice).count() == access.MAX_SSH_KEYS_PER_USER
    refused = [out["error"] for out in outcomes if "error" in out]
    assert len(refused) == THREADS - 1 and all(isinstance(e, access.SshKeyError) for e in refused)

    same = _public_key()
    outcomes = _all_at_once(THREADS, lambda n: access.ssh_key_add(user=bob, title="same", public_key=same))
    assert SshKey.objects.filter(user=bob).count() == 1
    assert sum("result" in out for out in outcomes) == 1


# ------------------------------------------------------------------- jobs


def test_a_finished_jobs_name_submitted_while_it_is_deleted_is_taken(alice, redis_server, monkeypatch):
    job = services.job_submit(owner=alice, config=_config("rerun", gpuNumber=NEVER_FITS_GPUS))
    services.job_stop(job=job, by=alice)
    key = tokens.token_create(user=alice, lifetime=timedelta(hours=1)).key
    refusal = job_store._refusal

    def deleted_meanwhile(pending, exc):
        thread, out = _in_thread(lambda: services.job_delete(job=job))  # after the INSERT met the old name
        thread.join()
        assert "error" not in out, out
        return refusal(pending, exc)

    monkeypatch.setattr(job_store, "_refusal", deleted_meanwhile)
    answer = Client().put(f"/api/v1/user/{alice.username}/jobs/rerun", _config("rerun", gpuNumber=NEVER_FITS_GPUS),
                          content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 202, answer.content
    assert Job.objects.get(owner=alice, name="rerun").state == State.WAITING


@pytest.fixture
def gpu_node():
    """A node the scheduler places on, with GPUs of a type of this test's own
    (no other test's jobs go there); nothing starts there (no agent)."""
    gpu_type = f"RACE{uuid.uuid4().hex[:6]}"
    node = Node.objects.create(name=f"t-race-{gpu_type.lower()}", address="127.0.0.9", docker_host="unix:///nonexistent",
                               cpus=64, memory_mb=64000, gpus=[{"index": i, "type": gpu_type} for i in range(2)],
                               gpus_simulated=True, port_start=33000, port_end=33099, last_heartbeat=timezone.now(),
                               agent_pid=os.getpid())
    yield node, gpu_type
    Node.objects.filter(pk=node.pk).update(schedulable=False)


def test_a_task_that_exits_while_its_job_is_stopped_is_stopped_not_failed(alice, redis_server, gpu_node):
    node, gpu_type = gpu_node
    job = services.job_submit(owner=alice, config=_config("stopped_as_it_ends", gpuNumber=1, top={"gpuType": gpu_type}))
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    services.schedule_pass()
    attempt = TaskAttempt.objects.get(job=job)
    assert lifecycle.attempt_claim_launch(attempt.pk)
    assert lifecycle.attempt_mark_running(attempt.pk, container_id="c" * 12)
    locked = threading.Event()

    def stop() -> None:
        # The user's stop holds the job's row while the node reports the exit
        # (killed by the stop: 137).
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(pk=job.pk))
            locked.set()
            _until_blocked_on_a_lock()
            services.job_stop(job=job, by=alice)

    stopping, stopped = _in_thread(stop)
    assert locked.wait(10)
    exiting, exited = _in_thread(lambda: lifecycle.attempt_record_exit(attempt.pk, lifecycle.ContainerExit(exit_code=137)))
    stopping.join()
    exiting.join()
    assert "error" not in stopped and "error" not in exited, (stopped, exited)
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert (attempt.state, attempt.exit_type) == ("STOPPED", "USER_STOP"), (attempt.state, attempt.exit_reason)
    assert job.state == State.STOPPED


# ---------------------------------------------------------------- webhooks


def test_deliveries_wait_while_a_failed_one_is_tried_again(alice, bob, monkeypatch):
    url = "http://127.0.0.1:9/hook"
    for user in (alice, bob):
        NotificationSettings.objects.create(user=user, webhook_url=url, webhook_secret_sealed=keys.seal_private_key(
            "s" * 20))
    entered, release, posts = threading.Event(), threading.Event(), []

    def post(target, body, headers, **kwargs):  # the receiver, still down
        posts.append(headers["X-Portal-Delivery"])
        entered.set()
        release.wait(10)
        return webhooks.Outcome(False, retry=True, status=503, message="HTTP 503")

    monkeypatch.setattr(webhooks, "post", post)
    monkeypatch.setattr(queues, "schedule_delivery_retry", lambda *args, **kwargs: None)

    def delivery(user, **fields) -> int:
        return NotificationDelivery.objects.create(user=user, channel="webhook", payload={"event": "x", "job": "j"},
                                                   target=url, **fields).pk

    failed = delivery(alice, status=Status.RETRYING, tries=1, next_try_at=timezone.now(), result="HTTP 503")
    retrying, retried = _in_thread(lambda: notifications.delivery_try(failed))  # its second try, on some node
    assert entered.wait(10)
    waiting = [delivery(alice) for _ in range(3)]
    assert [notifications.delivery_try(number) for number in waiting] == [Status.RETRYING] * 3
    release.set()
    retrying.join()
    assert retried.get("result") == Status.RETRYING and posts == [str(failed)]
    for number in waiting:
        row = NotificationDelivery.objects.get(pk=number)
        assert row.tries == 0 and row.next_try_at > timezone.now() and "is being tried again" in row.result
    # Another user's delivery to the same URL is not held by alice's.
    entered.clear()
    release.set()
    assert notifications.delivery_try(delivery(bob)) == Status.RETRYING and len(posts) == 2
