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
from redis.commands.core import Script
from rq import Queue

SCHEDULE_TIMEOUT = 300
LAUNCH_TIMEOUT = 3600  # a first pull of a big image can take long
STOP_TIMEOUT = 120

# A launch request: node name, task attempt id, and the id of the job's owner.
Launch = tuple[str, int, int]


@functools.cache
def connection() -> Redis:
    return django_rq.get_connection("default")


def script(text: str) -> Script:
    """The Lua script `text` on the queues' Redis: sent by hash after the
    first use; redis-py sends the whole script again if Redis restarted and
    forgot it."""
    return _registered(connection(), text)


@functools.cache
def _registered(redis: Redis, text: str) -> Script:
    return redis.register_script(text)


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


# Under a burst of submissions that cannot start (the cluster is full, or
# their virtual cluster is), passes may keep the agent that runs them busy
# for at most about this share of its time: a pass over a long queue costs
# more, so the next one waits longer (up to the max gap). With 1,000 waiting
# jobs a pass took ~20 ms, and ten a second took a fifth of a core that the
# web workers storing the burst needed (bench/api_submit_rate.py). After a
# pass that started tasks the next waits only the minimum gap: the cluster
# is moving, and a freed place must not stay idle (bench/e2e_throughput.py).
PASS_BUSY_SHARE = 0.1


def _last_pass_seconds_key() -> str:
    return f"{_prefix()}:last-pass-seconds"


def pass_gap(last_seconds: float | None, *, min_gap: float, max_gap: float) -> float:
    """Seconds from one pass's start to the next's, given how long the last
    pass took if it started nothing (0 if it started tasks): `min_gap` for a
    short pass, longer for a long one (so that passes keep their agent busy
    for at most PASS_BUSY_SHARE of the time), never more than `max_gap`."""
    if last_seconds is None:
        return min_gap
    return max(min_gap, min(max_gap, last_seconds / PASS_BUSY_SHARE))


def _pass_due_key() -> str:
    return f"{_prefix()}:pass-due"


def pass_pacing(now: float, last_start: float | None, last_seconds: float | None, last_due: float | None, *,
                min_gap: float, max_gap: float) -> tuple[float, float]:
    """(seconds this pass waits, its due time to keep for the next one).

    Passes are paced like a rate limit's cells (GCRA): each pass moves the
    due time on by its gap (`pass_gap`), and a pass may start up to
    `min_gap` before the due time. So a stream of back-to-back requests
    gets one pass per gap, as before, but a pass after a quiet spell never
    waits, even if a lone pass (a task's end) started just before it: a
    submission right after a task ended used to wait up to 100 ms for
    nothing (bench/submit_to_running.py's wake-up p95)."""
    if last_start is None:
        return 0.0, now
    gap = pass_gap(last_seconds, min_gap=min_gap, max_gap=max_gap)
    due = max(last_start if last_due is None else last_due, last_start) + gap
    return max(0.0, min(gap, due - min_gap - now)), due


def wait_for_pass_slot(min_gap: float, max_gap: float) -> None:
    """Wait as `pass_pacing` says. Under a burst of submissions,
    back-to-back passes would keep a core busy re-reading the queue; waiting
    here lets the requests that arrive meanwhile share the next pass (the
    request flag stays set until the pass starts)."""
    redis = connection()
    last, seconds, due = (None if value is None else float(value)
                          for value in redis.mget(_last_pass_key(), _last_pass_seconds_key(), _pass_due_key()))
    delay, due = pass_pacing(time.time(), last, seconds, due, min_gap=min_gap, max_gap=max_gap)
    if delay > 0:
        time.sleep(delay)
    pipe = redis.pipeline(transaction=False)
    pipe.set(_last_pass_key(), repr(time.time()), ex=60)
    pipe.set(_pass_due_key(), repr(due), ex=60)
    pipe.execute()


def pass_overdue(max_age: float) -> bool:
    """No scheduling pass has started for `max_age` seconds (or ever)."""
    last = connection().get(_last_pass_key())
    return last is None or time.time() - float(last) >= max_age


def repair_schedule_request() -> None:
    """Ask for a pass even if a request seems to be pending: the pending one
    may be lost (dropped with Redis, or taken by an agent that then stopped),
    and its flag would silence this request until it expires."""
    connection().delete(_schedule_flag())
    request_schedule()


def _launch_marker(attempt_id: int) -> str:
    return f"{_prefix()}:launch-requested:{attempt_id}"


def enqueue_launch(node_name: str, attempt_id: int, owner_id: int | None) -> None:
    """`owner_id`: the job owner's, which the node takes launches in turn by
    (jobs/node/launch_queue.py) without a query of its own."""
    connection().set(_launch_marker(attempt_id), "1", ex=LAUNCH_TIMEOUT)
    _queue(node_queue_name(node_name)).enqueue(
        "jobs.tasks.launch_task", attempt_id, owner_id, job_timeout=LAUNCH_TIMEOUT, result_ttl=0, failure_ttl=86400
    )


def enqueue_launches(launches: list[Launch]) -> None:
    """`enqueue_launch` for each (node name, attempt id, owner id), in pipelines: a
    scheduling pass may start thousands of tasks, and one at a time costs
    several round trips each (bench/scheduler_scale.py)."""
    for first in range(0, len(launches), 500):
        batch = launches[first:first + 500]
        by_node: dict[str, list[tuple[int, int | None]]] = {}
        for node_name, attempt_id, owner_id in batch:
            by_node.setdefault(node_name, []).append((attempt_id, owner_id))
        with connection().pipeline() as pipe:
            for _node_name, attempt_id, _owner_id in batch:
                pipe.set(_launch_marker(attempt_id), "1", ex=LAUNCH_TIMEOUT)
            for node_name, requests in by_node.items():
                _queue(node_queue_name(node_name)).enqueue_many([
                    Queue.prepare_data("jobs.tasks.launch_task", (attempt_id, owner_id), timeout=LAUNCH_TIMEOUT,
                                       result_ttl=0, failure_ttl=86400)
                    for attempt_id, owner_id in requests
                ], pipeline=pipe)
            pipe.execute()


def enqueue_launch_if_lost(node_name: str, attempt_id: int, owner_id: int | None) -> None:
    """Re-send a launch request only if Redis no longer knows of one (it was
    flushed or restarted); a request still queued is left alone."""
    if not connection().exists(_launch_marker(attempt_id)):
        enqueue_launch(node_name, attempt_id, owner_id)


def launch_started(attempt_id: int) -> None:
    connection().delete(_launch_marker(attempt_id))


def enqueue_stop(node_name: str, attempt_id: int) -> None:
    _queue(node_queue_name(node_name)).enqueue(
        "jobs.tasks.stop_task", attempt_id, job_timeout=STOP_TIMEOUT, result_ttl=0, failure_ttl=86400,
        at_front=True,
    )


# ------------------------------------------------------------- notifications
# Webhooks and e-mails about job state changes go through a queue of their
# own, which every node agent serves after its node's queue and the
# scheduler's, so a delivery never goes ahead of a launch, a stop or a pass.
# Retries wait in a sorted set (score: when they are due): the agents' RQ
# workers run without RQ's scheduler, and each agent's heartbeat moves the
# due ones onto the queue (enqueue_due_notifications).

NOTIFY_TIMEOUT = 120


def notify_queue_name() -> str:
    return f"{_prefix()}.notify"


def _notify_retries_key() -> str:
    return f"{_prefix()}:notify-retries"


def enqueue_notification(event: dict) -> None:
    _queue(notify_queue_name()).enqueue(
        "jobs.tasks.notify_job_state", event, job_timeout=NOTIFY_TIMEOUT, result_ttl=0, failure_ttl=86400
    )


def enqueue_delivery(delivery_id: int) -> None:
    _queue(notify_queue_name()).enqueue(
        "jobs.tasks.deliver_notification", delivery_id, job_timeout=NOTIFY_TIMEOUT, result_ttl=0, failure_ttl=86400
    )


def schedule_delivery_retry(delivery_id: int, due: float) -> None:
    """Try the delivery again at `due` (seconds since the epoch)."""
    connection().zadd(_notify_retries_key(), {str(delivery_id): due})


def enqueue_due_notifications(limit: int = 100, *, now: float | None = None) -> int:
    """Move the retries that are due (by `now`, a Unix time; the clock's by
    default) onto the queue; returns how many. Run by every agent at once:
    ZREM decides which one enqueues each."""
    redis = connection()
    due = redis.zrangebyscore(_notify_retries_key(), "-inf", time.time() if now is None else now, start=0, num=limit)
    moved = 0
    for member in due:
        if redis.zrem(_notify_retries_key(), member):
            enqueue_delivery(int(member))
            moved += 1
    return moved


# ------------------------------------------------------------- pass timings
# Scheduling passes run in node agents, on any machine; /metrics is answered
# by a web worker. Each pass adds itself to a histogram kept in one Redis
# hash (bucket counts, sum, count: one round trip), which /metrics reads.
# prometheus_client's multiprocess mode would need one folder shared by
# every process, which agents on other machines do not have.

PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _pass_histogram_key() -> str:
    return f"{_prefix()}:metrics:schedule-pass-seconds"


def record_pass_duration(seconds: float, *, started_tasks: bool = False) -> None:
    bucket = next((f"{bound:g}" for bound in PASS_BUCKETS if seconds <= bound), "+Inf")
    pipe = connection().pipeline(transaction=True)
    pipe.hincrby(_pass_histogram_key(), bucket, 1)
    pipe.hincrby(_pass_histogram_key(), "count", 1)
    pipe.hincrbyfloat(_pass_histogram_key(), "sum", seconds)
    # The next pass's gap (wait_for_pass_slot): paced only after a pass that started nothing.
    pipe.set(_last_pass_seconds_key(), repr(0.0 if started_tasks else seconds), ex=60)
    pipe.execute()


def read_pass_histogram_and_depths(queue_names: list[str]) -> tuple[dict[str, float], list[int]]:
    """The pass histogram's fields (bucket bound, "count", "sum": value; buckets
    not cumulative) and each queue's length, in one round trip."""
    pipe = connection().pipeline(transaction=False)
    pipe.hgetall(_pass_histogram_key())
    for name in queue_names:
        pipe.llen(_queue(name).key)
    histogram, *depths = pipe.execute()
    return {key.decode(): float(value) for key, value in histogram.items()}, [int(d) for d in depths]
