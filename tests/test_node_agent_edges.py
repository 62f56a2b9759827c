"""From the review of the node agent and its protocol with the portal: a
node agent restarted mid-launch, a node lost while its tasks were being
given up, a join token revoked while it is being used.

The containers a crashed or cut-off agent left behind are made on the
real Docker engine, as it would have left them; the database and Redis are
the real ones.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.utils import timezone

from jobs import queues, services, storage
from jobs.models import ACTIVE_TASK_STATES, ExitType, Job, Node, NodeJoinToken, State, TaskAttempt, TaskState
from jobs.node import launcher
from jobs.node.agent import NodeAgent
from jobs.node.context import NodeContext, Watchers
from jobs.node.follower import LogFollower
from jobs.node.launcher.docker import DockerEngine
from jobs.node.logwriter import LogWriter
from jobs.node.runner import Runner
from jobs.node.watcher import TaskWatcher
from jobs.services import join_tokens, nodes
from jobs.services.lifecycle import ContainerExit
from tests.cluster import wait_for
from tests.helpers import config, role, submit


@pytest.fixture
def node(make_user, own_instance) -> Iterator[Node]:
    """A node of the test's own (GPUs of a type no other node has), served
    by no agent process: the test plays its agent."""
    gpu_type = f"NR{uuid.uuid4().hex[:8].upper()}"
    node = Node.objects.create(
        name=f"t-review-{gpu_type.lower()}", address="127.0.0.2", docker_host="unix:///nonexistent",
        cpus=16, memory_mb=16000, gpus=[{"index": i, "type": gpu_type} for i in range(4)], gpus_simulated=True,
        port_start=40100, port_end=40199, last_heartbeat=timezone.now() + timedelta(hours=1), agent_pid=os.getpid(),
    )
    yield node
    Node.objects.filter(pk=node.pk).update(schedulable=False, last_heartbeat=timezone.now())
    for attempt_id in TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES).values_list("pk", flat=True):
        services.attempt_record_exit(attempt_id, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="test ended"))


def placed_attempt(user, node: Node) -> TaskAttempt:
    job = submit(user, config(f"nr-{uuid.uuid4().hex[:8]}", {**role(), "gpuNumber": 1}, gpuType=node.gpus[0]["type"]))
    services.schedule_pass()
    attempt = TaskAttempt.objects.get(job=job)
    assert attempt.node_id == node.pk, job.waiting_reason
    return attempt


IMAGE = "pai-local/busybox:latest"


@pytest.fixture
def engine(docker_engine: str) -> Iterator[DockerEngine]:
    """The real engine; what a test leaves on it is removed by its labels."""
    real = DockerEngine(docker_engine)
    yield real
    for left in real.containers({launcher.LABEL_INSTANCE: settings.PAI_INSTANCE}):
        real.remove(left.id)


def left_behind(engine: DockerEngine, attempt: TaskAttempt, node: Node, *, command: str | None,
                ended: bool = True) -> str:
    """A task container as a crashed agent left it: created and never
    started (`command` None), run to its end, or still running (`ended` False)."""
    labels = {launcher.LABEL_INSTANCE: settings.PAI_INSTANCE, launcher.LABEL_NODE: node.name,
              launcher.LABEL_TASK_ATTEMPT: str(attempt.pk)}
    made = engine.api.create_container(IMAGE, ["sh", "-c", command or "true"], labels=labels)
    if command is not None:
        engine.api.start(made["Id"])
        if ended:
            assert engine.api.wait(made["Id"], timeout=60)["StatusCode"] == 0
    return made["Id"]


def not_running(engine: DockerEngine, container_id: str) -> bool:
    """Stopped, or already removed: the agent removes a task's container
    once its exit is recorded, which may come between two looks."""
    state = engine.state(container_id)
    return state is None or not state.running


def restarted_agent(node: Node, engine: DockerEngine) -> NodeAgent:
    """An agent as it is once registered, before it serves: what its first
    reconciliation sees."""
    info = services.NodeInfo(name=node.name, address=node.address, docker_host=node.docker_host, engine_id="",
                             cpus=node.cpus, memory_mb=node.memory_mb)
    agent = NodeAgent(info, engine, 16)
    agent.context = NodeContext(node=node, engine=engine, engine_cpus=16, writer=agent.writer,
                                watchers=agent.watchers, follower=agent.follower)
    agent.runner = Runner(agent.context)
    return agent


# ------------------------------------------- an agent restarted mid-launch

def test_it_launches_again_a_task_whose_container_was_created_but_never_started(alice, node, engine):
    # The agent died between the container's create and its start: Docker
    # keeps a "created" container, exit code 0, never run. Adopted as it
    # was, the task was recorded RUNNING and then SUCCEEDED at once.
    attempt = placed_attempt(alice, node)
    assert services.attempt_claim_launch(attempt.pk)
    created = left_behind(engine, attempt, node, command=None)
    assert engine.state(created).exit_code == 0 and engine.state(created).started_at is None

    restarted_agent(node, engine).reconcile(fresh_start=True)

    attempt.refresh_from_db()
    assert attempt.state == TaskState.ASSIGNED, (attempt.state, attempt.exit_reason)
    assert engine.state(created) is None  # removed
    assert queues.connection().exists(queues._launch_marker(attempt.pk))


def test_it_adopts_a_task_whose_container_ran_while_its_agent_was_away(alice, node, engine):
    attempt = placed_attempt(alice, node)
    assert services.attempt_claim_launch(attempt.pk)
    ran = left_behind(engine, attempt, node, command="echo done")

    agent = restarted_agent(node, engine)
    agent.reconcile(fresh_start=True)

    attempt.refresh_from_db()
    assert attempt.state == TaskState.RUNNING and attempt.container_id == ran
    assert agent.watchers.get(attempt.pk) is not None  # its watcher records the exit


# --------------------------------------- a node lost, its check cut short

def test_it_fails_the_tasks_of_a_lost_node_left_running_by_a_check_cut_short(alice, node, monkeypatch):
    # The check that declares a node lost fails its tasks one by one after
    # the claim: one that stopped half-way (the database went away, the
    # agent was killed) left the rest RUNNING for good, as the node, LOST
    # now, was never looked at again.
    first, second = placed_attempt(alice, node), placed_attempt(alice, node)
    for attempt in (first, second):
        assert services.attempt_claim_launch(attempt.pk)
        assert services.attempt_mark_running(attempt.pk, container_id=f"c-{attempt.pk}")
    # Looked at from three hours on: the node's heartbeat (an hour ahead)
    # is then long past, while the test cluster's agents, looking now, see
    # it fresh and leave it to this test.
    now = timezone.now() + timedelta(hours=3)
    watch = nodes._Watch()  # this process watched, without a gap, for longer than the window
    for seconds in range(int(settings.NODE_LOST_AFTER_SECONDS) * 2 + 2, 0, -1):
        watch.since(now - timedelta(seconds=seconds))
    monkeypatch.setattr(nodes, "_watch", watch)

    def database_goes_away(execute, sql, params, many, context):
        if sql.startswith("UPDATE") and "jobs_taskattempt" in sql:
            raise OperationalError("the database went away")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(database_goes_away), pytest.raises(OperationalError):
        nodes.nodes_mark_lost(now)
    assert Node.objects.get(pk=node.pk).status == Node.Status.LOST

    nodes.nodes_mark_lost(now + timedelta(seconds=1))  # the next heartbeat's look

    for attempt in (first, second):
        attempt.refresh_from_db()
        assert (attempt.state, attempt.exit_type) == (TaskState.FAILED, ExitType.NODE_LOST), attempt.exit_reason


# ---------------------------------------- a join token revoked while used

def test_it_refuses_a_join_token_revoked_between_its_check_and_its_use(admin_user):
    made = join_tokens.join_token_create(by=admin_user, seconds=600)
    revoked = []

    def admin_revokes_meanwhile(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith("SELECT") and "jobs_nodejointoken" in sql and not revoked:
            revoked.append(join_tokens.join_token_revoke(token=made.token))  # as an admin's page, at that moment
        return result

    with connection.execute_wrapper(admin_revokes_meanwhile), pytest.raises(join_tokens.JoinTokenError) as refused:
        join_tokens.join_token_use(made.key, client="192.0.2.7")
    assert revoked == [True]
    assert refused.value.reason == "revoked"
    assert NodeJoinToken.objects.get(pk=made.token.pk).uses == 0


# ------------------------------- a node back after its tasks were given up

def stopped_task_container(engine: DockerEngine, user, node: Node) -> tuple[TaskAttempt, TaskWatcher]:
    """A running task whose job uploads outputs, its container having
    written /pai/output/result.txt and ended, and the watcher of its node
    that records the end."""
    attempt = placed_attempt(user, node)
    Job.objects.filter(pk=attempt.job_id).update(upload_outputs=True)
    assert services.attempt_claim_launch(attempt.pk)
    container_id = left_behind(engine, attempt, node, command="mkdir -p /pai/output && echo 42 > /pai/output/result.txt")
    assert services.attempt_mark_running(attempt.pk, container_id=container_id)
    context = NodeContext(node=node, engine=engine, engine_cpus=16, writer=LogWriter(),
                          watchers=Watchers(lambda *_: None), follower=LogFollower())  # type: ignore[arg-type]
    return attempt, TaskWatcher(context, attempt.pk, container_id)


def output_of(attempt: TaskAttempt) -> str:
    return storage.locate(Job.objects.get(pk=attempt.job_id).config["outputDir"]) + "/result.txt"


def test_it_uploads_no_output_of_a_task_given_up_while_its_node_was_cut_off(alice, node, engine):
    # The node was declared lost and the job ran again elsewhere, writing
    # outputDir; back, the agent stops the old container, whose /pai/output
    # was then uploaded over the new attempt's.
    attempt, watcher = stopped_task_container(engine, alice, node)
    services.attempt_record_exit(attempt.pk, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="node lost"))

    watcher._record_exit(engine.state(watcher.container_id))

    assert storage.backend().stat(output_of(attempt)) is None
    assert engine.state(watcher.container_id) is None  # removed all the same
    attempt.refresh_from_db()
    assert (attempt.state, attempt.exit_type) == (TaskState.FAILED, ExitType.NODE_LOST)


def test_it_uploads_the_output_of_a_task_that_ended_on_its_own(alice, node, engine):
    attempt, watcher = stopped_task_container(engine, alice, node)

    watcher._record_exit(engine.state(watcher.container_id))

    with storage.backend().open_read(output_of(attempt)) as stream:
        assert stream.read() == b"42\n"
    attempt.refresh_from_db()
    assert attempt.state == TaskState.SUCCEEDED


# ------------------------------------- a lost node whose agent restarts

def test_a_lost_node_stays_lost_when_its_agent_registers_until_nothing_given_up_runs_there(alice, node, engine):
    # Registering set a lost node READY at once, before the agent's first
    # reconciliation had stopped the containers of the tasks given up while
    # it was away: a pass could hand their GPUs and ports out meanwhile.
    attempt = placed_attempt(alice, node)
    assert services.attempt_claim_launch(attempt.pk)
    left = left_behind(engine, attempt, node, command="sleep 600", ended=False)  # as when the node was cut off
    assert services.attempt_mark_running(attempt.pk, container_id=left)
    services.attempt_record_exit(attempt.pk, ContainerExit(None, exit_type=ExitType.NODE_LOST, error="node lost"))
    Node.objects.filter(pk=node.pk).update(status=Node.Status.LOST)
    info = services.NodeInfo(name=node.name, address=node.address, docker_host=node.docker_host, engine_id="",
                             cpus=node.cpus, memory_mb=node.memory_mb, gpus=node.gpus, gpus_simulated=True,
                             port_start=node.port_start, port_end=node.port_end)

    assert services.node_register(info).status == Node.Status.LOST
    agent = restarted_agent(node, engine)
    assert not agent._runs_no_orphan()
    engine.api.kill(left)  # what the reconciliation's stop of the orphan comes to
    assert agent._runs_no_orphan()
    assert services.node_heartbeat(node.pk, back_ready=agent._runs_no_orphan)
    assert Node.objects.get(pk=node.pk).status == Node.Status.READY


# ------------------------------- a stop whose agent restarted in its grace

def test_an_agent_restarted_in_a_stops_grace_period_stops_the_task_again(alice, node, engine, settings):
    # The stop reached the agent, which sent SIGTERM and would have killed
    # the container after the grace period; the agent restarted meanwhile (a
    # deploy), and the program ignores SIGTERM. The restarted agent adopted
    # the container as a plain running task: the job stayed STOPPING for as
    # long as the program ran.
    settings.STOP_GRACE_SECONDS = 1
    attempt = placed_attempt(alice, node)
    assert services.attempt_claim_launch(attempt.pk)
    deaf = left_behind(engine, attempt, node, command="trap '' TERM; while :; do sleep 1; done", ended=False)
    assert services.attempt_mark_running(attempt.pk, container_id=deaf)
    job = services.job_stop(job=attempt.job, by=alice)
    assert job.state == State.STOPPING
    engine.signal(deaf, "SIGTERM")  # what the agent before the restart did
    time.sleep(0.5)
    assert engine.state(deaf).running  # ignored

    agent = restarted_agent(node, engine)
    agent.follower.start()
    try:
        agent.reconcile(fresh_start=True)
        wait_for(lambda: not_running(engine, deaf), timeout=30, what="the container killed after the grace")
        wait_for(lambda: Job.objects.get(pk=job.pk).state == State.STOPPED, timeout=30, what="the job STOPPED")
    finally:
        agent.follower.stop()


def test_a_stop_whose_request_never_reached_the_agent_is_made_by_its_next_reconciliation(alice, node, engine,
                                                                                          settings):
    # The job was stopped, but the request to the task's agent was lost
    # (Redis restarted empty, or the agent's worker died holding it): the
    # task ran on and the job stayed STOPPING until stopped again.
    settings.STOP_GRACE_SECONDS = 1
    attempt = placed_attempt(alice, node)
    assert services.attempt_claim_launch(attempt.pk)
    running = left_behind(engine, attempt, node, command="trap '' TERM; while :; do sleep 1; done", ended=False)
    assert services.attempt_mark_running(attempt.pk, container_id=running)
    agent = restarted_agent(node, engine)
    agent.follower.start()
    try:
        agent.reconcile(fresh_start=True)
        assert agent.watchers.get(attempt.pk) is not None
        job = services.job_stop(job=attempt.job, by=alice)  # its request goes to a queue nobody serves here
        assert job.state == State.STOPPING
        agent.reconcile()  # as its reconcile loop does
        wait_for(lambda: not_running(engine, running), timeout=30, what="the container stopped")
        wait_for(lambda: Job.objects.get(pk=job.pk).state == State.STOPPED, timeout=30, what="the job STOPPED")
    finally:
        agent.follower.stop()


# ---------------------------- a stop asked of an agent that died launching

def test_a_launch_given_back_after_its_agent_died_is_not_made_again_once_its_job_was_stopped(alice, node):
    # The stop reached only the agent that was launching the task, and died
    # with it: its restart handed the launch back and made it again, and
    # the job stayed STOPPING for as long as the task then ran.
    attempt = placed_attempt(alice, node)
    assert services.attempt_claim_launch(attempt.pk)  # the agent took it, then died
    services.job_stop(job=Job.objects.get(pk=attempt.job_id), by=alice)
    assert Job.objects.get(pk=attempt.job_id).state == "STOPPING"

    assert not services.attempt_unclaim(attempt.pk)  # the restarted agent's look: not given back

    attempt.refresh_from_db()
    assert (attempt.state, attempt.exit_type) == (TaskState.STOPPED, ExitType.USER_STOP)
    assert Job.objects.get(pk=attempt.job_id).state == "STOPPED"


def test_a_launch_cut_off_by_its_agents_death_is_given_back_when_no_stop_was_asked(alice, node):
    attempt = placed_attempt(alice, node)
    assert services.attempt_claim_launch(attempt.pk)
    assert services.attempt_unclaim(attempt.pk)
    attempt.refresh_from_db()
    assert attempt.state == TaskState.ASSIGNED
