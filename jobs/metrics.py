"""What /metrics tells Prometheus: jobs, nodes, GPUs, queues, passes.

Read fresh at each scrape, in a fixed number of queries whatever the size of
the cluster (eight to the database, one round trip to Redis), so a scrape
stays cheap with thousands of tasks (bench/metrics_scrape.py: p95 <= 100 ms
with 1,000 running tasks). Nothing is counted in this process: web workers
come and go, and most of what happens (scheduling passes, log lines) happens
in node agents, so every number comes from the database or Redis:

- counters that only grow are read off the tables' ids (every submission
  and every log row takes the next one), which costs one index lookup
  instead of a count over millions of rows;
- scheduling passes add their durations to a histogram in Redis
  (queues.record_pass_duration), which works for agents on any machine,
  unlike prometheus_client's multiprocess mode (one folder per machine).

Per-task CPU, memory, network and GPU use come from the newest usage sample
of each running task (written by node agents, jobs/services/usage.py; read
here in one query), labelled job, user, task and node: one series per
running task and figure (and per GPU for GPU figures), which disappears when
the task ends, so the label sets stay as many as the tasks running at once.

The text is written here rather than through prometheus_client's metric
families: with a thousand running tasks that is thousands of labelled
samples, and building a Sample object and formatting each of its labels
cost more than the database's part of a scrape. The output is the client's
own format (generate_latest's, HELP and TYPE lines included), which
tests/test_metrics.py reads back with prometheus_client's parser.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, Model, OuterRef, Subquery
from prometheus_client.utils import floatToGoString

from jobs import queues
from jobs.models import (
    ACTIVE_TASK_STATES,
    GpuAllocation,
    IdleGpus,
    Job,
    LogLine,
    Node,
    State,
    Task,
    TaskAttempt,
    TaskState,
    TaskUsage,
    User,
    VirtualCluster,
)
from jobs.services.nodes import placement_cutoff
from jobs.services.db_clock import database_now

log = logging.getLogger(__name__)


class TaskUse(NamedTuple):
    """The newest sample of one running task, with its labels' parts."""

    attempt_id: int
    cpu_percent: float
    memory_bytes: int
    network_rx_bytes: int
    network_tx_bytes: int
    gpus: list[dict[str, Any]]
    user: str
    job_name: str
    role: str
    index: int
    node: str
    idle: bool


@dataclass
class Snapshot:
    now: datetime
    vcs: dict[int, str]
    jobs: dict[tuple[str, int], int]  # (state, virtual cluster id): count
    nodes: list[Node]
    gpus_used: dict[int, set[int]]  # node id: GPU indexes held
    tasks: dict[str, int]  # active task state: count
    jobs_submitted: int
    log_lines_written: int
    redis_up: bool = True
    passes: dict[str, float] = field(default_factory=dict)
    queue_depths: dict[str, int] = field(default_factory=dict)
    usage: list[TaskUse] = field(default_factory=list)


# PostgreSQL: the same rows through LATERAL, one index step per running
# attempt. The portable form below (a correlated subquery inside IN) makes
# PostgreSQL run the subquery twice per attempt and took about 1.5 times as
# long with 1,000 tasks (bench/metrics_scrape.py --database postgres).
_LATEST_USAGE_POSTGRES = """
SELECT a.id, u.cpu_percent, u.memory_bytes, u.network_rx_bytes, u.network_tx_bytes, u.gpus,
       o.username, j.name, t.role, t."index", a.node_name, i.since
FROM {attempt} a
JOIN LATERAL (SELECT * FROM {usage} s WHERE s.attempt_id = a.id AND s.at >= %s AND NOT s.averaged
              ORDER BY s.at DESC LIMIT 1) u ON TRUE
JOIN {job} j ON j.id = a.job_id
JOIN {user} o ON o.id = j.owner_id
JOIN {task} t ON t.id = a.task_id
LEFT JOIN {idle} i ON i.attempt_id = a.id
WHERE a.state = %s
ORDER BY a.id
"""


def _latest_usage_query(recent: datetime) -> tuple[str, Sequence[Any]]:
    if connection.vendor == "postgresql":
        tables = {name: connection.ops.quote_name(model._meta.db_table) for name, model in (
            ("attempt", TaskAttempt), ("usage", TaskUsage), ("job", Job), ("user", User),
            ("task", Task), ("idle", IdleGpus))}
        return _LATEST_USAGE_POSTGRES.format(**tables), [recent, TaskState.RUNNING]
    # Elsewhere (SQLite): the running attempts (task_attempt_state_idx), each
    # one's newest sample a correlated subquery (task_usage_attempt_at_idx).
    newest = (TaskUsage.objects.filter(attempt=OuterRef("pk"), at__gte=recent, averaged=False)
              .order_by("-at").values("id")[:1])
    newest_ids = TaskAttempt.objects.filter(state=TaskState.RUNNING).order_by().values(last=Subquery(newest))
    rows = (TaskUsage.objects.filter(id__in=newest_ids).order_by("attempt_id")
            .values_list("attempt_id", "cpu_percent", "memory_bytes", "network_rx_bytes", "network_tx_bytes", "gpus",
                         "attempt__job__owner__username", "attempt__job__name", "attempt__task__role",
                         "attempt__task__index", "attempt__node_name", "attempt__idle_gpus__since"))
    return rows.query.sql_with_params()


def running_task_usage(now: datetime) -> list[TaskUse]:
    """The newest sample of each running task, if it is recent (three
    sampling periods), with its labels: one query, ordered by task attempt.

    Driven by the running attempts: each one's newest detailed sample is one
    backward step in task_usage_attempt_at_idx, so the cost follows the
    tasks running, not the samples or the ended tasks kept in the table.
    Rows come straight off the cursor: Django's per-value converters were a
    third of a scrape with 1,000 tasks."""
    recent = now - timedelta(seconds=3 * settings.USAGE_SAMPLE_SECONDS)
    sql, params = _latest_usage_query(recent)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    # JSON comes as text from both SQLite and PostgreSQL (Django's jsonb loader).
    return [TaskUse(attempt_id, cpu, memory, rx, tx, (json.loads(gpus) if isinstance(gpus, str) else gpus) or [],
                    user, name, role, index, node, idle_since is not None)
            for attempt_id, cpu, memory, rx, tx, gpus, user, name, role, index, node, idle_since in fetched]


def _last_id_handed_out(model: type[Model]) -> int:
    """The last id the database handed out for `model`'s rows: the counters
    below (jobs submitted, log lines written). Not the highest id there now,
    which goes down when the newest job is deleted, and Prometheus would
    take that for a reset of the counter."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":  # Django's AUTOINCREMENT keeps it there
            cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [table])
        elif connection.vendor == "postgresql":
            cursor.execute("SELECT pg_sequence_last_value(pg_get_serial_sequence(%s, 'id')::regclass)", [table])
        else:
            return model.objects.aggregate(n=Max("id"))["n"] or 0
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def snapshot() -> Snapshot:
    now = database_now()  # heartbeats' clock (services/sql_time.py)
    vcs = dict(VirtualCluster.objects.values_list("id", "name"))
    jobs = {(state, vc): n for state, vc, n in
            Job.objects.order_by().values_list("state", "virtual_cluster_id").annotate(n=Count("id"))}
    nodes = list(Node.objects.order_by("name").only("name", "status", "schedulable", "last_heartbeat", "agent_pid",
                                                    "gpus"))
    gpus_used: dict[int, set[int]] = defaultdict(set)
    for node_id, index in GpuAllocation.objects.values_list("node_id", "index"):
        gpus_used[node_id].add(index)
    tasks = dict(TaskAttempt.objects.filter(state__in=ACTIVE_TASK_STATES).order_by().values_list("state")
                 .annotate(n=Count("id")))
    result = Snapshot(
        now=now, vcs=vcs, jobs=jobs, nodes=nodes, gpus_used=gpus_used, tasks=tasks,
        jobs_submitted=_last_id_handed_out(Job),
        log_lines_written=_last_id_handed_out(LogLine),
        usage=running_task_usage(now),
    )
    names = [queues.scheduler_queue_name(), queues.notify_queue_name(),
             *(queues.node_queue_name(node.name) for node in nodes)]
    try:
        result.passes, depths = queues.read_pass_histogram_and_depths(names)
        result.queue_depths = dict(zip(names, depths))
    except Exception:  # Redis away: the database's numbers still count
        log.warning("/metrics: Redis did not answer", exc_info=True)
        result.redis_up = False
    return result


# ------------------------------------------------------------------ writing


def _label(value: object) -> str:
    """A label value, escaped as the text format wants."""
    text = str(value)
    if "\\" in text or "\n" in text or '"' in text:
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return text


def _value(number: float | int) -> str:
    """A sample value as generate_latest writes it (floatToGoString), with
    short cuts for what most values are: integers (written as integers, which
    the format allows) and floats Python already writes as Go does."""
    if type(number) is int:
        return str(number)
    if 0.0 <= number < 1e6:  # repr's form, like floatToGoString's for these (NaN fails the test)
        return repr(float(number))
    return floatToGoString(number)


class _Text:
    """Lines of the exposition, family by family."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: str, value: float | int) -> None:
        self.lines.append(f"{name}{{{labels}}} {floatToGoString(value)}" if labels else
                          f"{name} {floatToGoString(value)}")

    def render(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


def _jobs(out: _Text, snap: Snapshot) -> None:
    vcs = sorted(snap.vcs.items(), key=lambda item: item[1])
    out.family("portal_jobs", "gauge", "Jobs by state and virtual cluster.")
    for vc_id, vc in vcs:
        for state in State.values:
            out.sample("portal_jobs", f'state="{_label(state)}",virtual_cluster="{_label(vc)}"',
                       snap.jobs.get((state, vc_id), 0))
    out.family("portal_jobs_waiting", "gauge", "Jobs waiting to start, by virtual cluster.")
    for vc_id, vc in vcs:
        out.sample("portal_jobs_waiting", f'virtual_cluster="{_label(vc)}"', snap.jobs.get((State.WAITING, vc_id), 0))
    # Counters: generate_latest names their HELP and TYPE lines with _total too.
    out.family("portal_jobs_submitted_total", "counter",
               "Jobs submitted since the portal was installed (the last job id handed out).")
    out.sample("portal_jobs_submitted_total", "", snap.jobs_submitted)
    out.family("portal_task_attempts", "gauge", "Task containers not yet ended, by state.")
    for state in ACTIVE_TASK_STATES:
        out.sample("portal_task_attempts", f'state="{_label(state)}"', snap.tasks.get(state, 0))
    out.family("portal_log_lines_written_total", "counter",
               "Log rows stored since the portal was installed (the last log row id handed out).")
    out.sample("portal_log_lines_written_total", "", snap.log_lines_written)


def _nodes(out: _Text, snap: Snapshot) -> None:
    up: list[tuple[str, int]] = []
    ready: list[tuple[str, int]] = []
    age: list[tuple[str, float]] = []
    gpus: list[tuple[str, int, int]] = []  # labels, free, used
    cutoff = placement_cutoff(snap.now)
    for node in snap.nodes:
        name = _label(node.name)
        alive = node.status == Node.Status.READY and node.heartbeat_fresh(snap.now)
        up.append((name, int(alive)))
        takes = alive and node.schedulable and node.agent_pid is not None and node.last_heartbeat >= cutoff
        ready.append((name, int(takes)))
        if node.last_heartbeat is not None:
            age.append((name, max(0.0, (snap.now - node.last_heartbeat).total_seconds())))
        counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        held = snap.gpus_used.get(node.pk, ())
        for gpu in node.gpus:
            counts[str(gpu["type"])][int(gpu["index"]) in held] += 1
        gpus += [(f'gpu_type="{_label(kind)}",node="{name}"', n_free, n_used)
                 for kind, (n_free, n_used) in sorted(counts.items())]
    out.family("portal_node_up", "gauge", "1 if the node's agent was heard from within NODE_LOST_AFTER_SECONDS.")
    for name, value in up:
        out.sample("portal_node_up", f'node="{name}"', value)
    out.family("portal_node_ready", "gauge",
               "1 if the node takes new tasks now (agent running, recent heartbeat, not lost, schedulable).")
    for name, value in ready:
        out.sample("portal_node_ready", f'node="{name}"', value)
    out.family("portal_node_heartbeat_age_seconds", "gauge", "Seconds since the node's last heartbeat.")
    for name, seconds in age:
        out.sample("portal_node_heartbeat_age_seconds", f'node="{name}"', seconds)
    out.family("portal_node_gpus_free", "gauge", "GPUs no task holds, by node and GPU type.")
    for labels, n_free, _ in gpus:
        out.sample("portal_node_gpus_free", labels, n_free)
    out.family("portal_node_gpus_used", "gauge", "GPUs held by tasks, by node and GPU type.")
    for labels, _, n_used in gpus:
        out.sample("portal_node_gpus_used", labels, n_used)


def _redis(out: _Text, snap: Snapshot) -> None:
    out.family("portal_redis_up", "gauge", "1 if Redis answered this scrape.")
    out.sample("portal_redis_up", "", int(snap.redis_up))
    if not snap.redis_up:
        return
    out.family("portal_rq_queue_depth", "gauge", "Requests waiting in each RQ queue.")
    for name, count in snap.queue_depths.items():
        out.sample("portal_rq_queue_depth", f'queue="{_label(name)}"', count)
    name = "portal_schedule_pass_duration_seconds"
    out.family(name, "histogram", "How long scheduling passes took.")
    running = 0.0
    for bound in queues.PASS_BUCKETS:
        running += snap.passes.get(f"{bound:g}", 0.0)
        out.sample(f"{name}_bucket", f'le="{floatToGoString(bound)}"', running)
    running += snap.passes.get("+Inf", 0.0)
    out.sample(f"{name}_bucket", 'le="+Inf"', running)
    out.sample(f"{name}_count", "", running)
    out.sample(f"{name}_sum", "", snap.passes.get("sum", 0.0))


# (name, type, help, value of a TaskUse).
_TASK_FAMILIES: tuple[tuple[str, str, str, Callable[[TaskUse], float | int]], ...] = (
    ("portal_task_cpu_percent", "gauge", "CPU use of a running task (100 = one core), last sample.",
     lambda t: t.cpu_percent),
    ("portal_task_memory_bytes", "gauge", "Memory in use by a running task (less reclaimable page cache), last "
     "sample.", lambda t: t.memory_bytes),
    ("portal_task_network_receive_bytes_total", "counter", "Bytes a running task's container received since it "
     "started.", lambda t: t.network_rx_bytes),
    ("portal_task_network_transmit_bytes_total", "counter", "Bytes a running task's container sent since it "
     "started.", lambda t: t.network_tx_bytes),
    ("portal_task_gpus_idle", "gauge", "1 if the task's GPUs have stayed under IDLE_GPU_PERCENT for "
     "IDLE_GPU_MINUTES.", lambda t: int(t.idle)),
)
_GPU_FAMILIES = (
    ("portal_task_gpu_utilization_percent", "Utilisation of a real GPU a running task holds (NVML); simulated "
     "GPUs report none.", "utilPercent"),
    ("portal_task_gpu_memory_used_bytes", "Memory used on a real GPU a running task holds (NVML).",
     "memoryUsedBytes"),
)


def _tasks(out: _Text, snap: Snapshot) -> None:
    """Per running task (labels job, user, task, node; GPU figures also gpu):
    one series per task and figure, gone when the task ends. Each task's
    labels are formatted once for all its series."""
    labels = [f'job="{_label(f"{t.user}~{t.job_name}")}",user="{_label(t.user)}",'
              f'task="{_label(f"{t.role}-{t.index}")}",node="{_label(t.node)}"' for t in snap.usage]
    lines = out.lines
    for name, kind, help_text, value in _TASK_FAMILIES:
        out.family(name, kind, help_text)
        lines += [f"{name}{{{label}}} {_value(value(task))}" for task, label in zip(snap.usage, labels)]
    for name, help_text, key in _GPU_FAMILIES:
        out.family(name, "gauge", help_text)
        # A figure NVML did not give (or an agent wrote oddly) is left out, not a failed scrape.
        lines += [f'{name}{{{label},gpu="{_label(gpu.get("index"))}"}} {_value(gpu[key])}'
                  for task, label in zip(snap.usage, labels) for gpu in task.gpus
                  if isinstance(gpu, dict) and isinstance(gpu.get(key), (int, float))]


def render() -> bytes:
    """The exposition, in Prometheus's text format."""
    snap = snapshot()
    out = _Text()
    _jobs(out, snap)
    _nodes(out, snap)
    _redis(out, snap)
    _tasks(out, snap)
    return out.render()
