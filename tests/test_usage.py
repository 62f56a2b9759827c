"""Usage sampling (jobs/node/usage.py, jobs/services/usage.py): counters read
from real containers on the test engine, rounds written in one INSERT,
retention, and the idle-GPU rule on recorded series.

The sampler tests run it in this process against containers the test starts
itself (labelled with the test instance, so a crashed run's are removed);
the end-to-end test runs a job on a real node agent that samples every
half second.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import services
from jobs.models import ExitType, IdleGpus, Node, TaskAttempt, TaskUsage
from jobs.node.launcher import LABEL_INSTANCE, ContainerUsage, cgroups
from jobs.node.launcher.docker import DockerEngine, _usage_from_stats
from jobs.node.usage import UsageSampler, cpu_percent
from jobs.services import usage
from jobs.services.lifecycle import ContainerExit
from tests.cluster import wait_for
from tests.helpers import config, role, submit
from tests.services import BUSYBOX_IMAGE

# Burns one core and holds about 20 MB (a shell variable) until stopped.
BURN = "x=$(head -c 20000000 /dev/zero | tr '\\0' a); while :; do :; done"


# ------------------------------------------------------------- pure parts


def reading(cpu_ns: int) -> ContainerUsage:
    return ContainerUsage(cpu_ns=cpu_ns, memory_bytes=1, network_rx_bytes=0, network_tx_bytes=0,
                          block_read_bytes=0, block_write_bytes=0)


def test_cpu_percent_is_cpu_time_over_wall_time_with_100_for_one_core():
    assert cpu_percent((0, reading(0)), (2_000_000_000, reading(3_000_000_000))) == 150.0
    assert cpu_percent((0, reading(5)), (1_000_000_000, reading(1))) == 0.0  # a counter reset
    assert cpu_percent((7, reading(0)), (7, reading(9))) == 0.0


def test_it_sums_network_counters_of_every_interface_but_loopback():
    text = ("Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
            "    lo:  500 5 0 0 0 0 0 0  500 5 0 0 0 0 0 0\n"
            "  eth0: 1200 9 0 0 0 0 0 0  340 3 0 0 0 0 0 0\n"
            "  eth1:   10 1 0 0 0 0 0 0    5 1 0 0 0 0 0 0\n")
    assert cgroups.network_counters(text) == (1210, 345)


def test_it_reads_the_stats_endpoints_cgroup_v1_and_v2_shapes():
    v1 = {"cpu_stats": {"cpu_usage": {"total_usage": 900}},
          "memory_stats": {"usage": 5000, "stats": {"total_inactive_file": 1000}},
          "networks": {"eth0": {"rx_bytes": 7, "tx_bytes": 3}},
          "blkio_stats": {"io_service_bytes_recursive": [{"op": "Read", "value": 11}, {"op": "Write", "value": 2},
                                                         {"op": "Total", "value": 13}]}}
    assert _usage_from_stats(v1) == ContainerUsage(900, 4000, 7, 3, 11, 2)
    v2 = {"cpu_stats": {"cpu_usage": {"total_usage": 5}}, "memory_stats": {"usage": 10, "stats": {"inactive_file": 4}},
          "blkio_stats": {"io_service_bytes_recursive": [{"op": "read", "value": 1}, {"op": "write", "value": 1}]}}
    assert _usage_from_stats(v2) == ContainerUsage(5, 6, 0, 0, 1, 1)
    assert _usage_from_stats({"cpu_stats": {}, "memory_stats": {}}) is None  # a stopped container


T0 = datetime(2026, 5, 4, 10, 0, tzinfo=dt_timezone.utc)


def series(*utils: list[float] | None, step: float = 5.0) -> list[tuple[datetime, list[float]]]:
    return [(T0 + timedelta(seconds=i * step), u or []) for i, u in enumerate(utils)]


GAP = timedelta(seconds=15)


def test_idle_since_reads_back_from_the_newest_sample_while_every_gpu_is_under_the_threshold():
    assert usage.idle_since(series([90, 2], [3, 2], [1, 0], [4, 4]), threshold=5, max_gap=GAP) == T0 + timedelta(seconds=5)
    assert usage.idle_since(series([1, 1], [1, 1]), threshold=5, max_gap=GAP) == T0


def test_idle_since_is_none_when_the_newest_sample_is_busy_or_has_no_gpu_figures():
    assert usage.idle_since(series([1], [1], [50]), threshold=5, max_gap=GAP) is None
    assert usage.idle_since(series([1], [5]), threshold=5, max_gap=GAP) is None  # at the threshold is busy
    assert usage.idle_since(series([1], None), threshold=5, max_gap=GAP) is None  # simulated GPUs: no figures
    assert usage.idle_since([], threshold=5, max_gap=GAP) is None


def test_idle_since_stops_at_a_gap_in_the_samples():
    samples = series([1], [1], step=60.0) + [(T0 + timedelta(minutes=10), [1]), (T0 + timedelta(minutes=10, seconds=5), [1])]
    assert usage.idle_since(samples, threshold=5, max_gap=GAP) == T0 + timedelta(minutes=10)


# ----------------------------------------------------- rows of the test's own


@pytest.fixture
def node(redis_server) -> Iterator[Node]:
    """A node of the test's own, with GPUs of a type no other node has, so
    the test's jobs land here; this process plays its agent."""
    gpu_type = f"US{uuid.uuid4().hex[:8].upper()}"
    made = Node.objects.create(
        name=f"t-usage-{gpu_type.lower()}", address=f"{gpu_type.lower()}.invalid", docker_host=settings.DOCKER_HOST,
        cpus=16, memory_mb=16000, gpus=[{"index": i, "type": gpu_type} for i in range(4)], gpus_simulated=True,
        port_start=40100, port_end=40199, last_heartbeat=timezone.now() + timedelta(hours=1), agent_pid=os.getpid())
    yield made
    Node.objects.filter(pk=made.pk).update(schedulable=False, last_heartbeat=timezone.now())
    for attempt_id in TaskAttempt.objects.filter(node=made, state="RUNNING").values_list("pk", flat=True):
        services.attempt_record_exit(attempt_id, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="the test ended"))


def running_tasks(user, node: Node, count: int, container_ids: list[str] | None = None, **top: Any) -> list[TaskAttempt]:
    """A job of `count` one-GPU tasks placed on `node` and marked running
    in the given containers (fake ids when none); `top`: more of the config
    (retryCount ...)."""
    job = submit(user, config(f"us-{uuid.uuid4().hex[:8]}", role(tasks=count, gpus=1), gpuType=node.gpus[0]["type"],
                              **top))
    services.schedule_pass()
    attempts = list(TaskAttempt.objects.filter(job=job).order_by("id"))
    assert len(attempts) == count, job.waiting_reason
    for i, attempt in enumerate(attempts):
        assert services.attempt_claim_launch(attempt.pk)
        cid = container_ids[i] if container_ids else f"fake-{attempt.pk}"
        assert services.attempt_mark_running(attempt.pk, container_id=cid)
    return attempts


@dataclass
class Ctx:
    """What the sampler reads of a NodeContext."""

    node: Node
    engine: Any


@pytest.fixture
def containers(docker_engine) -> Iterator[list[str]]:
    """Two real containers burning CPU; removed when the test ends."""
    import docker

    client = docker.from_env()
    made = [client.containers.run(BUSYBOX_IMAGE, ["sh", "-c", BURN], detach=True, nano_cpus=500_000_000,
                                  labels={LABEL_INSTANCE: settings.PAI_INSTANCE}) for _ in range(2)]
    yield [c.id for c in made]
    for container in made:
        container.remove(force=True)


def test_it_samples_cpu_and_memory_of_real_containers_in_one_insert_per_round(alice, node, containers):
    attempts = running_tasks(alice, node, 2, containers)
    engine = DockerEngine(settings.DOCKER_HOST)
    wait_for(lambda: all(engine.usage(containers)[c].memory_bytes > 15_000_000 for c in containers),
             what="the containers to hold their 20 MB and burn")
    sampler = UsageSampler(Ctx(node, DockerEngine(settings.DOCKER_HOST)), gpus=None)
    assert sampler.sample_round() == 0  # the first round primes the counters
    primed = {c: r.cpu_ns for c, r in engine.usage(containers).items()}
    wait_for(lambda: all(engine.usage(containers)[c].cpu_ns > primed[c] + 10**8 for c in containers),
             what="the containers to burn some more CPU")
    with CaptureQueriesContext(connection) as queries:
        assert sampler.sample_round() == 2
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('INSERT INTO "jobs_taskusage"')]
    assert len(inserts) == 1
    rows = {row.attempt_id: row for row in TaskUsage.objects.filter(attempt__in=attempts)}
    assert set(rows) == {a.pk for a in attempts}
    for row in rows.values():
        assert 0 < row.cpu_percent <= 100, row.cpu_percent  # limited to half a core, with some slack for the clock
        assert row.memory_bytes > 10_000_000  # the 20 MB the shell holds
        assert row.gpus == []  # simulated GPUs: no figures, never invented ones


def test_the_stats_endpoint_gives_the_same_counters_when_cgroup_files_are_not_here(containers):
    engine = DockerEngine(settings.DOCKER_HOST)
    engine.cgroup_root = cgroups.Path("/nonexistent")  # an engine on another machine
    found = engine.usage(containers)
    assert set(found) == set(containers)
    assert all(r.cpu_ns > 0 and r.memory_bytes > 0 for r in found.values())
    assert engine.usage(["0" * 64]) == {}  # a container that does not exist is left out


class FakeGpus:
    """NVML cannot run here (no GPU): the reader interface, with fixed figures."""

    def read(self, indexes: list[int]) -> list[dict]:
        return [{"index": i, "utilPercent": 42.0, "memoryUsedBytes": 1000} for i in indexes]


def test_it_reads_gpu_figures_only_on_nodes_with_real_gpus(alice, node, containers):
    attempts = running_tasks(alice, node, 1, containers[:1])
    Node.objects.filter(pk=node.pk).update(gpus_simulated=False)
    node.refresh_from_db()
    sampler = UsageSampler(Ctx(node, DockerEngine(settings.DOCKER_HOST)), gpus=FakeGpus())
    sampler.sample_round()
    sampler.sample_round()
    row = TaskUsage.objects.filter(attempt=attempts[0]).last()
    assert row.gpus == [{"index": attempts[0].gpus[0], "utilPercent": 42.0, "memoryUsedBytes": 1000}]


# ---------------------------------------------------------------- retention


def test_it_folds_old_samples_into_minute_averages_and_drops_old_averages(alice, node, settings):
    settings.USAGE_DETAIL_HOURS = 1
    settings.USAGE_MINUTES_DAYS = 1
    (attempt,) = running_tasks(alice, node, 1)
    now = timezone.now().replace(second=30, microsecond=0)
    minute = (now - timedelta(hours=2)).replace(second=0)
    old = [usage.Sample(attempt.pk, minute + timedelta(seconds=s), cpu_percent=c, memory_bytes=m,
                        network_rx_bytes=rx, gpus=[{"index": 0, "utilPercent": g, "memoryUsedBytes": 10}])
           for s, c, m, rx, g in ((0, 10, 100, 1, 0), (20, 20, 200, 5, 10), (40, 60, 600, 9, 20))]
    recent = usage.Sample(attempt.pk, now - timedelta(minutes=5), cpu_percent=1, memory_bytes=1)
    usage.samples_record([*old, recent])
    TaskUsage.objects.create(attempt=attempt, at=now - timedelta(days=2), averaged=True, cpu_percent=1, memory_bytes=1)
    # Compaction is the cluster's, oldest minute first: other tests' old
    # samples are folded too, so it runs until nothing is left to fold.
    folded = 0
    while done := usage.usage_compact(now=now):
        folded += done
    assert folded >= 3
    rows = list(TaskUsage.objects.filter(attempt=attempt).order_by("at"))
    assert [(r.averaged, r.at) for r in rows] == [(True, minute), (False, recent.at)]
    average = rows[0]
    assert (average.cpu_percent, average.memory_bytes, average.network_rx_bytes) == (30, 300, 9)
    assert average.gpus == [{"index": 0, "utilPercent": 10, "memoryUsedBytes": 10}]
    assert usage.usage_compact(now=now) == 0  # nothing twice


# ----------------------------------------------------------------- idle GPUs


def gpu_samples(attempt: TaskAttempt, *, minutes: int, util: float, end: datetime) -> None:
    usage.samples_record([usage.Sample(attempt.pk, end - timedelta(seconds=s), cpu_percent=100, memory_bytes=1,
                                       gpus=[{"index": i, "utilPercent": util, "memoryUsedBytes": 1} for i in attempt.gpus])
                          for s in range(0, minutes * 60 + 1, 5)])


def test_it_flags_a_task_whose_gpus_stayed_idle_and_unflags_it_when_they_work(alice, node, settings):
    settings.IDLE_GPU_MINUTES, settings.IDLE_GPU_PERCENT, settings.USAGE_SAMPLE_SECONDS = 10, 5, 5
    idle, busy, short = running_tasks(alice, node, 3)
    now = timezone.now()
    gpu_samples(idle, minutes=11, util=1, end=now)
    gpu_samples(busy, minutes=11, util=80, end=now)
    gpu_samples(short, minutes=4, util=0, end=now)  # idle, but not for long enough yet
    assert usage.idle_gpus_check(node_id=node.pk, now=now) == [idle.pk]
    assert IdleGpus.objects.get(attempt=idle).since <= now - timedelta(minutes=10)
    gpu_samples(idle, minutes=0, util=95, end=now + timedelta(seconds=5))
    assert usage.idle_gpus_check(node_id=node.pk, now=now + timedelta(seconds=6)) == []
    assert not IdleGpus.objects.filter(attempt=idle).exists()


def test_it_tells_the_owner_once_when_the_policy_says_notify(alice, node, settings, mailoutbox):
    settings.IDLE_GPU_MINUTES, settings.IDLE_GPU_POLICY = 10, "notify"
    settings.PAI_INSTANCE = f"pai-test-usage-{uuid.uuid4().hex[:8]}"  # a notify queue no agent serves
    settings.EMAIL_HOST, settings.EMAIL_BACKEND = "smtp.invalid", "django.core.mail.backends.locmem.EmailBackend"
    alice.email = "alice@example.org"
    alice.save()
    (attempt,) = running_tasks(alice, node, 1)
    now = timezone.now()
    gpu_samples(attempt, minutes=11, util=0, end=now)
    from jobs.models import NotificationDelivery
    from jobs.services import notifications

    usage.idle_gpus_check(node_id=node.pk, now=now)
    usage.idle_gpus_check(node_id=node.pk, now=now + timedelta(seconds=1))
    (delivery,) = NotificationDelivery.objects.filter(user=alice, payload__event="idleGpus")
    assert delivery.payload["task"] == "main-0" and delivery.target == "alice@example.org"
    notifications.delivery_try(delivery.pk)
    (mail,) = mailoutbox
    assert "idle" in mail.subject and "main-0" in mail.body
