"""What /metrics tells Prometheus: jobs, nodes, GPUs, queues, passes.

Read fresh at each scrape, in a fixed number of queries whatever the size of
the cluster (eight to the database, one round trip to Redis), so a scrape
stays cheap with thousands of tasks (bench/metrics_scrape.py). Nothing is
counted in this process: web workers come and go, and most of what happens
(scheduling passes, log lines) happens in node agents, so every number comes
from the database or Redis:

- counters that only grow are read off the tables' ids (every submission
  and every log row takes the next one), which costs one index lookup
  instead of a count over millions of rows;
- scheduling passes add their durations to a histogram in Redis
  (queues.record_pass_duration), which works for agents on any machine,
  unlike prometheus_client's multiprocess mode (one folder per machine).

Per-task CPU, memory, network, block I/O and GPU use come from the newest
usage sample of each running task (jobs/services/usage.py, two more
queries), labelled job, user, task and node: one series per running task
and figure (and per GPU for GPU figures), which disappears when the task
ends, so the label sets stay as many as the tasks running at once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Max
from django.utils import timezone
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from jobs import queues
from jobs.models import ACTIVE_TASK_STATES, GpuAllocation, Job, LogLine, Node, State, TaskAttempt, VirtualCluster
from jobs.services import usage as usage_service
from jobs.services.nodes import placement_cutoff

log = logging.getLogger(__name__)


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
    usage: list[usage_service.LatestUsage] = field(default_factory=list)


def snapshot() -> Snapshot:
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
        now=timezone.now(), vcs=vcs, jobs=jobs, nodes=nodes, gpus_used=gpus_used, tasks=tasks,
        jobs_submitted=Job.objects.aggregate(n=Max("id"))["n"] or 0,
        log_lines_written=LogLine.objects.aggregate(n=Max("id"))["n"] or 0,
        usage=usage_service.latest_of_running(),
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


def _jobs(snap: Snapshot) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("portal_jobs", "Jobs by state and virtual cluster.", labels=["state", "virtual_cluster"])
    waiting = GaugeMetricFamily("portal_jobs_waiting", "Jobs waiting to start, by virtual cluster.",
                                labels=["virtual_cluster"])
    for vc_id, vc in sorted(snap.vcs.items(), key=lambda item: item[1]):
        for state in State.values:
            jobs.add_metric([state, vc], snap.jobs.get((state, vc_id), 0))
        waiting.add_metric([vc], snap.jobs.get((State.WAITING, vc_id), 0))
    yield jobs
    yield waiting
    submitted = CounterMetricFamily("portal_jobs_submitted", "Jobs submitted since the portal was installed "
                                    "(the last job id handed out).")
    submitted.add_metric([], snap.jobs_submitted)
    yield submitted
    tasks = GaugeMetricFamily("portal_task_attempts", "Task containers not yet ended, by state.", labels=["state"])
    for state in ACTIVE_TASK_STATES:
        tasks.add_metric([state], snap.tasks.get(state, 0))
    yield tasks


def _nodes(snap: Snapshot) -> Iterator[Metric]:
    up = GaugeMetricFamily("portal_node_up", "1 if the node's agent was heard from within NODE_LOST_AFTER_SECONDS.",
                           labels=["node"])
    ready = GaugeMetricFamily("portal_node_ready", "1 if the node takes new tasks now (agent running, recent "
                              "heartbeat, not lost, schedulable).", labels=["node"])
    age = GaugeMetricFamily("portal_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat.",
                            labels=["node"])
    free = GaugeMetricFamily("portal_node_gpus_free", "GPUs no task holds, by node and GPU type.",
                             labels=["node", "gpu_type"])
    used = GaugeMetricFamily("portal_node_gpus_used", "GPUs held by tasks, by node and GPU type.",
                             labels=["node", "gpu_type"])
    cutoff = placement_cutoff(snap.now)
    for node in snap.nodes:
        alive = node.status == Node.Status.READY and node.heartbeat_fresh(snap.now)
        up.add_metric([node.name], int(alive))
        takes = alive and node.schedulable and node.agent_pid is not None and node.last_heartbeat >= cutoff
        ready.add_metric([node.name], int(takes))
        if node.last_heartbeat is not None:
            age.add_metric([node.name], max(0.0, (snap.now - node.last_heartbeat).total_seconds()))
        counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for gpu in node.gpus:
            counts[str(gpu["type"])][int(gpu["index"]) in snap.gpus_used.get(node.pk, ())] += 1
        for kind, (n_free, n_used) in sorted(counts.items()):
            free.add_metric([node.name, kind], n_free)
            used.add_metric([node.name, kind], n_used)
    yield from (up, ready, age, free, used)


def _redis(snap: Snapshot) -> Iterator[Metric]:
    redis_up = GaugeMetricFamily("portal_redis_up", "1 if Redis answered this scrape.")
    redis_up.add_metric([], int(snap.redis_up))
    yield redis_up
    if not snap.redis_up:
        return
    depth = GaugeMetricFamily("portal_rq_queue_depth", "Requests waiting in each RQ queue.", labels=["queue"])
    for name, count in snap.queue_depths.items():
        depth.add_metric([name], count)
    yield depth
    buckets, running = [], 0.0
    for bound in queues.PASS_BUCKETS:
        running += snap.passes.get(f"{bound:g}", 0.0)
        buckets.append((floatToGoString(bound), running))
    buckets.append(("+Inf", running + snap.passes.get("+Inf", 0.0)))
    yield HistogramMetricFamily("portal_schedule_pass_duration_seconds", "How long scheduling passes took.",
                                buckets=buckets, sum_value=snap.passes.get("sum", 0.0))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# (name, type, help, value of a LatestUsage). Written here rather than
# through prometheus_client: with a thousand running tasks that is thousands
# of labelled samples, and formatting each task's labels once is several
# times faster than the client's per-sample formatting (bench/metrics_scrape.py).
_TASK_FAMILIES = (
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


def _tasks_usage_text(snap: Snapshot) -> str:
    """Per running task (labels job, user, task, node; GPU figures also gpu):
    one series per task and figure, gone when the task ends."""
    labels = [f'job="{_label(t.job)}",user="{_label(t.user)}",task="{_label(t.task)}",node="{_label(t.node)}"'
              for t in snap.usage]
    out: list[str] = []
    for name, kind, help_text, value in _TASK_FAMILIES:
        base = name.removesuffix("_total")
        out += [f"# HELP {base} {help_text}", f"# TYPE {base} {kind}"]
        out += [f"{name}{{{label}}} {floatToGoString(value(task))}" for task, label in zip(snap.usage, labels)]
    for name, help_text, key in _GPU_FAMILIES:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out += [f'{name}{{{label},gpu="{gpu["index"]}"}} {floatToGoString(gpu[key])}'
                for task, label in zip(snap.usage, labels) for gpu in task.gpus]
    return "\n".join(out) + "\n"


class _Collector:
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        yield from _jobs(self.snap)
        written = CounterMetricFamily("portal_log_lines_written", "Log rows stored since the portal was installed "
                                      "(the last log row id handed out).")
        written.add_metric([], self.snap.log_lines_written)
        yield written
        yield from _nodes(self.snap)
        yield from _redis(self.snap)


def render() -> bytes:
    """The exposition, in Prometheus's text format."""
    snap = snapshot()
    return generate_latest(_Collector(snap)) + _tasks_usage_text(snap).encode()  # type: ignore[arg-type]
