"""The RQ queues: wake-ups for the scheduler and requests to node agents.

Redis is not the source of truth. Everything put here can be lost (a flush,
a restart) and rebuilt: node agents re-enqueue pending launches and request a
scheduling pass when they reconcile.
"""

from __future__ import annotations

import functools
import time

import django_rq
from django.conf import settings
from redis import Redis
from rq import Queue

SCHEDULE_TIMEOUT = 300
LAUNCH_TIMEOUT = 3600  # a first pull of a big image can take long
STOP_TIMEOUT = 120


@functools.cache
def connection() -> Redis:
    return django_rq.get_connection("default")


def _prefix() -> str:
    return settings.PAI_INSTANCE


def scheduler_queue_name() -> str:
    return f"{_prefix()}.scheduler"


def node_queue_name(node_name: str) -> str:
    return f"{_prefix()}.node.{node_name}"


def _schedule_flag() -> str:
    return f"{_prefix()}:schedule-requested"


def _queue(name: str) -> Queue:
    return Queue(name, connection=connection())


def request_schedule() -> None:
    """Ask for a scheduling pass soon. Many requests before the pass starts
    make one pass: the flag is cleared when a pass begins. It also expires
    soon, because a pass request can be lost (an agent stopped just as it
    took it from the queue) and must not silence later requests for long."""
    if connection().set(_schedule_flag(), "1", nx=True, ex=5):
        _queue(scheduler_queue_name()).enqueue(
            "jobs.tasks.schedule", job_timeout=SCHEDULE_TIMEOUT, result_ttl=0, failure_ttl=86400
        )


def schedule_pass_started() -> None:
    connection().delete(_schedule_flag())


def _last_pass_key() -> str:
    return f"{_prefix()}:last-pass-started"


def wait_for_pass_slot(min_gap: float) -> None:
    """Start passes at most every `min_gap` seconds. Under a burst of
    submissions, back-to-back passes would keep a core busy re-reading the
    queue; waiting here lets the requests that arrive meanwhile share the
    next pass (the request flag stays set until the pass starts). An idle
    cluster never waits: its last pass is long past."""
    redis = connection()
    last = redis.get(_last_pass_key())
    if last is not None:
        delay = float(last) + min_gap - time.time()
        if delay > 0:
            time.sleep(min(delay, min_gap))
    redis.set(_last_pass_key(), repr(time.time()), ex=60)


def _launch_marker(attempt_id: int) -> str:
    return f"{_prefix()}:launch-requested:{attempt_id}"


def enqueue_launch(node_name: str, attempt_id: int) -> None:
    connection().set(_launch_marker(attempt_id), "1", ex=LAUNCH_TIMEOUT)
    _queue(node_queue_name(node_name)).enqueue(
        "jobs.tasks.launch_task", attempt_id, job_timeout=LAUNCH_TIMEOUT, result_ttl=0, failure_ttl=86400
    )


def enqueue_launch_if_lost(node_name: str, attempt_id: int) -> None:
    """Re-send a launch request only if Redis no longer knows of one (it was
    flushed or restarted); a request still queued is left alone."""
    if not connection().exists(_launch_marker(attempt_id)):
        enqueue_launch(node_name, attempt_id)


def launch_started(attempt_id: int) -> None:
    connection().delete(_launch_marker(attempt_id))


def enqueue_stop(node_name: str, attempt_id: int) -> None:
    _queue(node_queue_name(node_name)).enqueue(
        "jobs.tasks.stop_task", attempt_id, job_timeout=STOP_TIMEOUT, result_ttl=0, failure_ttl=86400,
        at_front=True,
    )
