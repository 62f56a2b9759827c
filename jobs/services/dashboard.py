"""The admin dashboard's figures over time (read-only, a selector).

Built from rows the portal keeps anyway, so it needs no recorder of its own:

- jobs waiting and running per virtual cluster: each job attempt waits from
  its creation until it starts (or ends unstarted) and runs until it ends;
- GPUs in use per virtual cluster and per user: each task attempt holds its
  GPUs from its placement until it ends;
- CPU cores and memory in use: the usage samples (jobs/services/usage.py),
  summed per minute in the database and weighted by the time each sample
  stands for (USAGE_SAMPLE_SECONDS for a detailed one, 60 s for an average).

GPUs in the cluster (and each virtual cluster's share of them, for its free
GPUs) is today's count of ready nodes' GPUs: nodes keep no history, so a
node that joined or left within the window is not reflected.
Each figure is the value at the start of its bucket.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from jobs.models import IdleGpus, JobAttempt, Node, TaskAttempt, TaskUsage

# Window (hours) -> bucket (minutes): about 70 to 100 points a graph.
WINDOWS = {6: 5, 24: 15, 168: 120}
TOP_USERS = 8


@dataclass(frozen=True)
class Buckets:
    start: datetime
    step: timedelta
    count: int

    def index(self, at: datetime) -> int:
        """The first bucket starting at or after `at` (clamped to the window)."""
        if at <= self.start:
            return 0
        whole, rest = divmod(at - self.start, self.step)
        return min(self.count, whole + (1 if rest else 0))

    def times(self) -> list[float]:
        return [(self.start + i * self.step).timestamp() for i in range(self.count)]


def buckets_for(hours: int, now: datetime) -> Buckets:
    step = timedelta(minutes=WINDOWS[hours])
    end = now - (now - now.replace(hour=0, minute=0, second=0, microsecond=0)) % step + step
    count = int(timedelta(hours=hours) / step) + 1
    return Buckets(start=end - count * step, step=step, count=count)


def _count_intervals(buckets: Buckets, intervals: Iterable[tuple[str, datetime, datetime | None, int]]
                     ) -> dict[str, list[int]]:
    """{key: [sum of the weights of the intervals covering each bucket's start]}
    for (key, from, until or None, weight) intervals."""
    deltas: dict[str, list[int]] = defaultdict(lambda: [0] * (buckets.count + 1))
    for key, begin, end, weight in intervals:
        first = buckets.index(begin)
        last = buckets.index(end) if end is not None else buckets.count
        if first < last:
            deltas[key][first] += weight
            deltas[key][last] -= weight
    series = {}
    for key, changes in deltas.items():
        running, values = 0, []
        for change in changes[:-1]:
            running += change
            values.append(running)
        series[key] = values
    return series


def _jobs(buckets: Buckets, end: datetime) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    attempts = (JobAttempt.objects.filter(created_at__lt=end).filter(Q(finished_at__isnull=True) |
                                                                     Q(finished_at__gte=buckets.start))
                .values_list("job__virtual_cluster__name", "created_at", "started_at", "finished_at"))
    waiting, running = [], []
    for vc, created, started, finished in attempts:
        waiting.append((vc, created, started or finished, 1))
        if started is not None:
            running.append((vc, started, finished, 1))
    return _count_intervals(buckets, waiting), _count_intervals(buckets, running)


def _gpus(buckets: Buckets, end: datetime) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    held = (TaskAttempt.objects.filter(assigned_at__lt=end).exclude(gpus=[])
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=buckets.start))
            .values_list("job__virtual_cluster__name", "job__owner__username", "assigned_at", "finished_at", "gpus"))
    by_vc, by_user = [], []
    for vc, user, assigned, finished, gpus in held:
        by_vc.append((vc, assigned, finished, len(gpus)))
        by_user.append((user, assigned, finished, len(gpus)))
    users = _count_intervals(buckets, by_user)
    top = sorted(users, key=lambda u: -max(users[u]))[:TOP_USERS]
    return _count_intervals(buckets, by_vc), {user: users[user] for user in sorted(top)}


def _bucket_seconds(buckets: Buckets, now: datetime) -> list[float]:
    """The seconds of each bucket gone by at `now`: the whole step but for
    the last one, which holds now and has samples only up to it."""
    step = buckets.step.total_seconds()
    return [min(step, max(1.0, (now - (buckets.start + i * buckets.step)).total_seconds()))
            for i in range(buckets.count)]


def _samples(buckets: Buckets, end: datetime, now: datetime) -> tuple[list[float], list[float]]:
    """CPU cores and GiB of memory in use, averaged over each bucket (the
    last one over its time so far)."""
    cores = [0.0] * buckets.count
    memory = [0.0] * buckets.count
    spans = _bucket_seconds(buckets, now)
    for averaged in (False, True):  # one query each, along the (averaged, at) index
        rows = (TaskUsage.objects.filter(averaged=averaged, at__gte=buckets.start, at__lt=end)
                .annotate(minute=TruncMinute("at")).values_list("minute")
                .annotate(cpu=Sum("cpu_percent"), mem=Sum("memory_bytes")))
        seconds = 60.0 if averaged else settings.USAGE_SAMPLE_SECONDS
        for minute, cpu, mem in rows:
            i = min(buckets.count - 1, int((minute - buckets.start) / buckets.step))
            cores[i] += (cpu or 0.0) / 100.0 * seconds / spans[i]
            memory[i] += (mem or 0) / 2**30 * seconds / spans[i]
    return [round(c, 2) for c in cores], [round(m, 3) for m in memory]


def _tasks(buckets: Buckets, end: datetime) -> list[int]:
    """Task containers running (from their start to their end)."""
    rows = (TaskAttempt.objects.filter(started_at__lt=end).filter(Q(finished_at__isnull=True) |
                                                                  Q(finished_at__gte=buckets.start))
            .values_list("started_at", "finished_at"))
    return _count_intervals(buckets, (("tasks", started, finished, 1) for started, finished in rows)).get(
        "tasks", [0] * buckets.count)


def cluster_over_time(*, hours: int, vc_gpus: dict[str, int] | None = None,
                      now: datetime | None = None) -> dict[str, Any]:
    """Everything the dashboard draws, JSON-ready (times in epoch seconds).
    `vc_gpus`: each virtual cluster's GPUs today (its share), for its free GPUs."""
    now = now or timezone.now()
    buckets = buckets_for(hours, now)
    end = buckets.start + buckets.count * buckets.step
    waiting, running = _jobs(buckets, end)
    gpus_vc, gpus_user = _gpus(buckets, end)
    cores, memory = _samples(buckets, end, now)
    total = sum(len(node.gpus) for node in Node.objects.filter(status=Node.Status.READY).only("gpus"))
    free = {vc: [max(0, share - used) for used in gpus_vc.get(vc, [0] * buckets.count)]
            for vc, share in (vc_gpus or {}).items() if share}
    return {"times": buckets.times(), "gpusTotal": total, "gpusByVc": gpus_vc, "gpusFreeByVc": free,
            "gpusByUser": gpus_user, "waitingByVc": waiting, "runningByVc": running,
            "tasksRunning": _tasks(buckets, end), "cpuCores": cores, "memoryGiB": memory}


def idle_gpu_tasks() -> list[IdleGpus]:
    """Tasks flagged for idle GPUs, oldest first (the dashboard lists them)."""
    return list(IdleGpus.objects.filter(attempt__state="RUNNING")
                .select_related("attempt__task", "attempt__job__owner").order_by("since"))
