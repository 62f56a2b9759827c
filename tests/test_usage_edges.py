"""Usage, the dashboard and idle GPUs, from review: edges the first tests
did not reach (jobs/services/usage.py, jobs/services/dashboard.py,
jobs/api/views/usage.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import docker
import pytest
from django.conf import settings
from django.utils import timezone

from jobs import services
from jobs.models import ExitType, Node, NotificationDelivery, TaskUsage
from jobs.services import dashboard, usage
from jobs.node.launcher.docker import DockerEngine
from jobs.node.usage import UsageSampler
from jobs.services.lifecycle import ContainerExit
from tests.cluster import wait_for
from tests.test_usage import Ctx, containers, gpu_samples, node, running_tasks  # noqa: F401  (fixtures)
from tests.test_usage_api import logged_in, v1_url, v2_url


@pytest.mark.parametrize("since", ["9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.9995+00:00"])
def test_since_at_the_last_millisecond_a_time_can_hold_gives_no_samples_not_a_500(alice, node, since):  # noqa: F811
    """The next millisecond after it cannot be held: it was an OverflowError."""
    attempt = running_tasks(alice, node, 1)[0]
    try:
        for url in (v1_url(attempt.job), v2_url(attempt.job)):
            answer = logged_in(alice).get(url, {"since": since})
            assert answer.status_code == 200, answer.content
            body = answer.json()
            assert (body.get("samples") if "samples" in body else body["tasks"][0]["samples"]) == []
    finally:
        TaskUsage.objects.filter(attempt=attempt).delete()


def test_a_flag_left_by_a_task_that_ended_on_a_lost_node_is_never_told(alice, node, settings):  # noqa: F811
    """Flags are told by any agent's check, and only the task's own node
    removes its flag: a task flagged under IDLE_GPU_POLICY=flag whose node
    was lost keeps its flag, and the first check after a switch to notify
    told its owner about a task that had ended."""
    settings.IDLE_GPU_MINUTES, settings.IDLE_GPU_PERCENT, settings.IDLE_GPU_POLICY = 10, 5, "flag"
    settings.PAI_INSTANCE = f"pai-test-usage-{uuid.uuid4().hex[:8]}"  # a notify queue no agent serves
    settings.EMAIL_HOST, settings.EMAIL_BACKEND = "smtp.invalid", "django.core.mail.backends.locmem.EmailBackend"
    alice.email = f"{alice.username}@example.org"
    alice.save(update_fields=["email"])
    (attempt,) = running_tasks(alice, node, 1)
    now = timezone.now()
    other = Node.objects.create(name=f"t-usage-other-{uuid.uuid4().hex[:8]}", address="other.invalid", cpus=1,
                                memory_mb=1000, gpus=[], port_start=40200, port_end=40201)
    try:
        gpu_samples(attempt, minutes=11, util=0, end=now)
        assert usage.idle_gpus_check(node_id=node.pk, now=now) == [attempt.pk]
        services.attempt_record_exit(attempt.pk, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="node lost"))
        settings.IDLE_GPU_POLICY = "notify"
        usage.idle_gpus_check(node_id=other.pk, now=now + timedelta(minutes=1))
        assert not NotificationDelivery.objects.filter(user=alice, payload__event="idleGpus").exists()
    finally:
        TaskUsage.objects.filter(attempt=attempt).delete()
        other.delete()


def test_the_dashboards_bucket_holding_now_averages_cpu_and_memory_over_its_time_so_far(alice, node):  # noqa: F811
    """Two tasks using 2 cores and 1 GiB each for the 150 s of the current
    5-minute bucket so far use 4 cores and 2 GiB: the bucket was averaged
    over all its 300 s, half of them still to come, and the graphs always
    ended in a dip to half (or less) of what was in use."""
    attempts = running_tasks(alice, node, 2)
    start = datetime(2020, 1, 6, 10, 0, tzinfo=UTC)  # a window no other test writes samples in
    now = start + timedelta(seconds=150)
    try:
        usage.samples_record([usage.Sample(a.pk, start + timedelta(seconds=s), cpu_percent=200, memory_bytes=2**30)
                              for a in attempts for s in range(0, 150, 5)])
        figures = dashboard.cluster_over_time(hours=6, now=now)
        assert figures["times"][-1] == start.timestamp()
        assert (figures["cpuCores"][-1], figures["memoryGiB"][-1]) == (4.0, 2.0)
    finally:
        TaskUsage.objects.filter(attempt__in=attempts).delete()


def test_a_cpu_counter_that_goes_back_gives_no_figure_that_round_not_a_made_up_zero(alice, node, containers):  # noqa: F811
    """A container restarted in place starts its CPU counter again from 0:
    the round that saw it go back stored 0% CPU, a figure the task never had."""
    attempts = running_tasks(alice, node, 2, containers)
    engine = DockerEngine(settings.DOCKER_HOST)
    sampler = UsageSampler(Ctx(node, engine), gpus=None)
    try:
        wait_for(lambda: all(r.cpu_ns > 3 * 10**8 for r in engine.usage(containers).values()),
                 what="the containers to burn some CPU")
        assert sampler.sample_round() == 0  # the first round primes the counters
        primed = {c: r.cpu_ns for c, r in engine.usage(containers).items()}
        client = docker.from_env()
        for container_id in containers:
            client.containers.get(container_id).restart(timeout=0)
        wait_for(lambda: all(c in found and found[c].cpu_ns < primed[c]
                             for found in [engine.usage(containers)] for c in containers),
                 what="the restarted containers' counters, from 0 again")
        assert sampler.sample_round() == 0  # gone back: no figure this round
        # Over a long enough round to burn some: a few milliseconds of a
        # container held to half a core may truly have used none.
        since = {c: r.cpu_ns for c, r in engine.usage(containers).items()}
        wait_for(lambda: all(r.cpu_ns > since[c] + 10**8 for c, r in engine.usage(containers).items()),
                 what="the restarted containers to burn some CPU")
        assert sampler.sample_round() == 2
        figures = list(TaskUsage.objects.filter(attempt__in=attempts).values_list("cpu_percent", flat=True))
        assert len(figures) == 2 and all(figure > 0 for figure in figures), figures
    finally:
        TaskUsage.objects.filter(attempt__in=attempts).delete()
