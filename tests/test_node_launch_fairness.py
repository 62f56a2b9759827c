"""A node takes its launches in turn by owner (jobs/node/launch_queue.py):
one user's long line of launches no longer holds every other user's task
on the node behind all of it.

A node agent of its own (a real process) and real containers. Positions in
the launch order, not moments, are compared: the agent writes each launch's
(bench/submit_to_running.py's PAI_BENCH_TIMING_FILE) as the launch threads
took them, and how many had been taken when it was queued.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import transaction

from jobs import services
from jobs.models import State, TaskAttempt
from tests.cluster import wait_for
from tests.helpers import config, role, stop_node_agent, submit, wait_state

pytestmark = pytest.mark.services

NODE, GPU_TYPE = "t-node-fair", "FAIRTEST"
LONG_LINE = 24  # the first user's tasks, all placed at once on the node


def launches_written(timing_file: Path, count: int) -> dict[int, dict]:
    """Each attempt's first launch as the agent wrote it, once `count` were."""
    def written() -> dict[int, dict] | None:
        if not timing_file.exists():
            return None
        launches: dict[int, dict] = {}
        for line in timing_file.read_text().splitlines():
            marks = json.loads(line)
            launches.setdefault(marks["attempt"], marks)
        return launches if len(launches) >= count else None

    return wait_for(written, timeout=60, what=f"{count} launches in {timing_file}")


def test_another_users_task_starts_before_a_first_users_long_line_of_launches_drains(alice, bob, cluster, tmp_path):
    timing_file = tmp_path / "launches.jsonl"
    cluster.start_agent(NODE, ports=cluster.port_range(5), cpus=LONG_LINE + 8, gpus=LONG_LINE + 1,
                        gpu_type=GPU_TYPE, env={"PAI_BENCH_TIMING_FILE": str(timing_file)})
    try:
        # Both placed by one pass, alice's first: the node gets her whole
        # line of launch requests, then bob's one (the way a pass sends
        # them, through Redis). The agents' own passes, woken by the
        # submissions, find the jobs placed once this commits.
        with transaction.atomic():
            long_line = submit(alice, config("long-line", role(command="true", tasks=LONG_LINE, gpus=1),
                                             gpuType=GPU_TYPE))
            other = submit(bob, config("other-user", role(command="true", gpus=1), gpuType=GPU_TYPE))
            services.schedule_pass()
        for job in (long_line, other):
            job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=120)
            assert job.state == State.SUCCEEDED, job.exit_reason
        launches = launches_written(timing_file, LONG_LINE + 1)
    finally:
        stop_node_agent(cluster, NODE)

    bobs_id = TaskAttempt.objects.get(job=other).pk
    alices = [launches[pk]["position"] for pk in TaskAttempt.objects.filter(job=long_line).values_list("pk", flat=True)]
    bobs = launches[bobs_id]
    queued_at, position = bobs["taken_before"], bobs["position"]
    # Taken after alice's launches that were in line when bob's came, one
    # at most (her turn may have been next): not after all of them.
    in_line_then = [p for p in alices if p >= queued_at]
    assert len([p for p in in_line_then if p < position]) <= 1, (queued_at, position, sorted(alices))
    # Her line had not drained when bob's came (the pass sent his request
    # after all of hers, and a claim is one UPDATE, a launch a container's
    # create and start): what this test is about did happen.
    assert len(in_line_then) >= 4, (queued_at, position, sorted(alices))
