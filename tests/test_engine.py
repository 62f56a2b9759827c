"""The execution engine against the real thing: node agents (separate
processes), a real Redis and the Docker engine running real containers."""

from __future__ import annotations

import docker
import pytest
from django.conf import settings

from jobs import services
from jobs.models import ExitType, JobAttempt, LogCursor, State, Stream, TaskAttempt
from tests.cluster import wait_for
from tests.helpers import config, example, lines, role, running_attempt, stop_node_agent, submit, wait_state

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _cluster(cluster):
    return cluster


def test_it_runs_the_hello_world_example_to_success(alice):
    cfg = example("hello-world-cifar10.json", jobName="hello", image="pai-local/busybox:latest")
    cfg["taskRoles"][0]["command"] = "echo hello world from $PAI_JOB_NAME; echo on stderr >&2"
    cfg["taskRoles"][0]["cpuNumber"] = 1
    job = wait_state(submit(alice, cfg), State.SUCCEEDED)
    assert lines(job) == ["hello world from hello"]
    assert lines(job, Stream.STDERR) == ["on stderr"]
    assert job.exit_code == 0 and job.exit_type == ExitType.SUCCEEDED
    assert job.started_at and job.finished_at


def test_it_reports_a_failing_command_with_its_exit_code(alice):
    job = wait_state(submit(alice, config("fails", role(command="echo before; exit 3"))), State.FAILED)
    assert job.exit_code == 3
    assert job.exit_type == ExitType.USER_EXIT
    assert "exited with code 3" in job.exit_reason
    assert lines(job) == ["before"]


def test_it_runs_a_two_node_job_whose_tasks_talk_through_the_environment(alice):
    # Each task needs 10 of a node's 16 CPUs, so the two land on different
    # nodes. The server answers HTTP (retried by the client until it is up);
    # the job succeeds once the client has read the server's page.
    server = role("ps", "mkdir /www && echo served-by-$PAI_CURRENT_TASK_ROLE_NAME > /www/index.html && "
                  "exec httpd -f -h /www -p $PAI_CONTAINER_HOST_http_PORT_LIST", cpus=10,
                  portList=[{"label": "http", "beginAt": 0, "portNumber": 1}])
    client = role("worker", cpus=10, minSucceededTaskCount=1, command=(
        "for i in $(seq 100); do wget -qO- http://$PAI_HOST_IP_ps_0:$PAI_PORT_LIST_ps_0_http/ && exit 0; "
        "sleep 0.2; done; exit 1"))
    job = wait_state(submit(alice, config("dist", server, client)), State.SUCCEEDED, State.FAILED)
    assert job.state == State.SUCCEEDED, job.exit_reason
    nodes = set(TaskAttempt.objects.filter(job=job).values_list("node_name", flat=True))
    assert len(nodes) == 2
    assert lines(job, role="worker") == ["served-by-ps"]


def test_it_kills_a_memory_hog_and_says_so(alice):
    # dd reads into one 400 MB buffer: far past the 128 MB limit.
    job = wait_state(submit(alice, config("hog", role(command="dd if=/dev/zero of=/dev/null bs=400M count=1", memory=128))),
                     State.FAILED, State.SUCCEEDED, timeout=90)
    assert job.exit_type == ExitType.OOM
    assert "exceeding its memory limit (128 MB)" in job.exit_reason


def test_it_stops_a_long_job(alice):
    job = wait_state(submit(alice, config("long", role(command="echo started; sleep 600"))), State.RUNNING)
    wait_for(lambda: lines(job) == ["started"], what="the task to print")
    services.job_stop(job=job, by=alice)
    job = wait_state(job, State.STOPPED, timeout=30)
    assert job.exit_type == ExitType.USER_STOP
    assert f"stopped by {alice.username}" in job.exit_reason
    attempt = TaskAttempt.objects.get(job=job)
    assert attempt.state == "STOPPED" and attempt.exit_type == ExitType.USER_STOP
    assert not attempt.gpu_allocations.exists() and not attempt.port_allocations.exists()


def test_it_retries_a_failed_job_and_keeps_the_history(alice):
    job = wait_state(submit(alice, config("retry", role(command="echo attempt $PAI_JOB_ATTEMPT; exit 1"), retryCount=2)),
                     State.FAILED, timeout=90)
    attempts = list(JobAttempt.objects.filter(job=job).order_by("number"))
    assert [a.state for a in attempts] == [State.FAILED] * 3
    assert job.retries == 2
    assert lines(job, number=3) == ["attempt 3"]


def test_it_never_retries_a_job_stopped_by_its_user(alice):
    job = wait_state(submit(alice, config("noretry", role(command="sleep 600"), retryCount=3)), State.RUNNING)
    wait_for(lambda: TaskAttempt.objects.filter(job=job, state="RUNNING").exists(), what="the task to run")
    services.job_stop(job=job, by=alice)
    job = wait_state(job, State.STOPPED, timeout=30)
    assert JobAttempt.objects.filter(job=job).count() == 1


def test_it_keeps_a_waiting_job_until_another_frees_the_gpus(alice):
    # t-node-b has the only two TITANX GPUs.
    first = submit(alice, config("first", role(command="sleep 4", gpus=2), gpuType="TITANX"))
    wait_state(first, State.RUNNING)
    second = submit(alice, config("second", role(command="echo got the gpus: $NVIDIA_VISIBLE_DEVICES", gpus=2), gpuType="TITANX"))
    wait_for(lambda: "TITANX" in type(second).objects.get(pk=second.pk).waiting_reason, what="a reason to wait")
    second.refresh_from_db()
    assert second.state == State.WAITING
    assert "2 GPUs of type TITANX" in second.waiting_reason
    wait_state(first, State.SUCCEEDED, timeout=60)
    second = wait_state(second, State.SUCCEEDED, timeout=60)
    assert lines(second) == ["got the gpus: 0,1"]


def test_it_exposes_allocated_gpus_without_asking_docker_for_simulated_ones(alice):
    job = wait_state(submit(alice, config("gpus", role(command="echo $NVIDIA_VISIBLE_DEVICES; sleep 3", gpus=2), gpuType="V100")),
                     State.RUNNING)
    attempt = running_attempt(job, timeout=30)
    host_config = docker.from_env().api.inspect_container(attempt.container_id)["HostConfig"]
    assert not host_config.get("DeviceRequests")
    assert len(attempt.gpus) == 2 and attempt.node_name == "t-node-a"
    wait_state(job, State.SUCCEEDED)
    assert lines(job) == [",".join(map(str, attempt.gpus))]


def test_it_keeps_a_failed_container_when_is_debug_is_set(alice):
    job = wait_state(submit(alice, config("debug", role(command="exit 7"), jobEnvs={"isDebug": True})), State.FAILED)
    attempt = TaskAttempt.objects.get(job=job)
    wait_for(lambda: TaskAttempt.objects.get(pk=attempt.pk).kept_for_debug, what="the container to be kept")
    container = docker.from_env().containers.get(attempt.container_id)
    assert container.status == "exited"


def test_it_ends_the_job_when_min_succeeded_task_count_is_reached(alice):
    fast = role("worker", "echo done", tasks=2, minSucceededTaskCount=2)
    slow = role("ps", "sleep 600")
    job = wait_state(submit(alice, config("minsucc", slow, fast)), State.SUCCEEDED, timeout=60)
    assert "minSucceededTaskCount is 2" in job.exit_reason
    ps = TaskAttempt.objects.get(job=job, task__role="ps")
    wait_for(lambda: TaskAttempt.objects.get(pk=ps.pk).state == "STOPPED", what="the ps task to be stopped")


def test_it_runs_the_early_example_with_kill_all_on_completed_task_number(alice):
    cfg = example("distributed-tensorflow-early.jsonc", jobName="early", image="pai-local/busybox:latest",
                  dataDir="", outputDir="", codeDir="")
    for item in cfg["taskRoles"]:
        item.update(cpuNumber=1, memoryMB=256, gpuNumber=0)
    cfg["taskRoles"][0]["command"] = "sleep 600"
    cfg["taskRoles"][1]["command"] = "echo $PAI_TASK_ROLE_1_HOST_LIST $PAI_TASK_ROLE_INDEX $PAI_TASKS_NUM"
    job = wait_state(submit(alice, cfg), State.SUCCEEDED, timeout=60)
    assert "killAllOnCompletedTaskNumber is 2" in job.exit_reason
    out = lines(job, role="worker", index=1)[0].split()
    assert out[1:] == ["1", "4"] and len(out[0].split(",")) == 2


def test_it_sets_every_reference_environment_variable(alice):
    names = [
        "PAI_JOB_NAME", "PAI_USER_NAME", "PAI_DEFAULT_FS_URI", "PAI_DATA_DIR", "PAI_OUTPUT_DIR", "PAI_CODE_DIR",
        "PAI_TASK_ROLE_COUNT", "PAI_TASK_ROLE_LIST", "PAI_TASK_ROLE_TASK_COUNT_a", "PAI_HOST_IP_a_0", "PAI_HOST_IP_b_1",
        "PAI_PORT_LIST_a_0_http", "PAI_RESOURCE_b", "PAI_MIN_FAILED_TASK_COUNT_a", "PAI_MIN_SUCCEEDED_TASK_COUNT_a",
        "PAI_CURRENT_TASK_ROLE_NAME", "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX", "PAI_TASK_INDEX",
        "PAI_CONTAINER_HOST_IP",
        "PAI_CONTAINER_HOST_http_PORT_LIST", "PAI_TASK_ROLE_a_HOST_LIST", "PAI_TASK_ROLE_NAME", "PAI_TASK_ROLE_NUM",
        "PAI_TASK_CPU_NUM", "PAI_TASK_MEM_MB", "PAI_TASK_GPU_NUM", "PAI_TASK_ROLE_INDEX", "PAI_TASK_ROLE_NO",
        "PAI_TASKS_NUM", "PAI_TASK_ROLES_NUM", "PAI_KILL_ALL_ON_COMPLETED_TASK_NUM", "PAI_CURRENT_CONTAINER_IP",
        "PAI_CURRENT_CONTAINER_PORT", "PAI_TASK_ROLE_0_HOST_LIST", "PAI_TASK_ROLE_1_HOST_LIST", "myvar",
    ]
    command = "; ".join(f'echo "{n}=${{{n}-UNSET}}"' for n in names)
    ports = [{"label": "http", "beginAt": 0, "portNumber": 1}]
    job = wait_state(submit(alice, config("envs", role("a", command, portList=ports), role("b", "true", tasks=2),
                                          jobEnvs={"myvar": 42})), State.SUCCEEDED)
    env = dict(line.split("=", 1) for line in lines(job, role="a"))
    assert "UNSET" not in env.values(), [k for k, v in env.items() if v == "UNSET"]
    assert env["PAI_JOB_NAME"] == "envs" and env["PAI_USER_NAME"] == alice.username
    assert env["PAI_TASK_ROLE_LIST"] == "a,b" and env["PAI_TASKS_NUM"] == "3" and env["myvar"] == "42"
    assert env["PAI_RESOURCE_b"] == "0,1,256,64"
    assert env["PAI_TASK_ROLE_a_HOST_LIST"] == f"{env['PAI_HOST_IP_a_0']}:{env['PAI_PORT_LIST_a_0_http']}"


def test_it_isolates_task_containers(alice, tmp_path):
    import socket

    # A stand-in for the portal's Redis and database: a service on the host's
    # loopback. The kernel queues any connection that gets through, so a
    # non-blocking accept afterwards tells whether one did.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    # busybox nc exits 1 when the connection is refused or times out.
    probe = (
        f"gw=$(ip route | awk '/default/ {{print $3}}'); "
        f"timeout 4 nc -w 2 127.0.0.1 {port} </dev/null; [ $? = 1 ] && echo loopback-closed || echo loopback-open; "
        f"timeout 4 nc -w 2 $gw {port} </dev/null; [ $? = 1 ] && echo gateway-closed || echo gateway-open; "
        "[ -e /var/run/docker.sock ] && echo docker-sock || echo no-docker-sock; "
        "env | grep -E 'REDIS|DATABASE_URL|SECRET' || echo no-secrets"
    )
    job = wait_state(submit(alice, config("iso", role(command=probe))), State.SUCCEEDED)
    assert lines(job) == ["loopback-closed", "gateway-closed", "no-docker-sock", "no-secrets"]
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing reached it
    listener.close()
    attempt = TaskAttempt.objects.get(job=job)
    # The container is gone once the task ended; check how it was made from a running one.
    running = wait_state(submit(alice, config("iso2", role(command="sleep 30"))), State.RUNNING)
    container_id = running_attempt(running, timeout=30).container_id
    host_config = docker.from_env().api.inspect_container(container_id)["HostConfig"]
    assert host_config["Privileged"] is False
    assert host_config["NetworkMode"] != "host"
    assert not host_config.get("Binds")
    assert attempt.state == "SUCCEEDED"


def test_it_stores_long_lines_and_binary_output(alice):
    command = ("head -c 40000 /dev/zero | tr '\\0' 'x'; echo; printf 'bad \\377\\376 bytes\\n'; "
               "printf 'no newline at the end'")
    job = wait_state(submit(alice, config("bytes", role(command=command))), State.SUCCEEDED)
    out = lines(job)
    assert out[0] == "x" * 40000
    assert out[1] == "bad \ufffd\ufffd bytes"
    assert out[2] == "no newline at the end"


def test_it_streams_lines_while_the_task_runs(alice):
    job = wait_state(submit(alice, config("stream", role(command="echo first; sleep 600"))), State.RUNNING)
    wait_for(lambda: lines(job) == ["first"], timeout=10, what="the line to arrive while the task runs")
    job.refresh_from_db()
    assert job.state == State.RUNNING


def test_it_resumes_log_capture_after_the_node_agent_is_killed(alice, cluster):
    import signal

    command = "i=0; while [ $i -lt 150 ]; do i=$((i+1)); echo line $i; sleep 0.04; done"
    job = wait_state(submit(alice, config("resume", role(command=command, gpus=1), gpuType="TITANX")), State.RUNNING)
    wait_for(lambda: len(lines(job)) >= 20, what="some lines")
    agent = cluster.agent("t-node-b")
    agent.stop(signal.SIGKILL)
    cluster.start_agent("t-node-b", ports=cluster.port_range(1), gpus=2, gpu_type="TITANX")
    job = wait_state(job, State.SUCCEEDED, timeout=60)
    assert lines(job) == [f"line {i}" for i in range(1, 151)]


def test_it_relaunches_pending_launches_after_redis_is_flushed(alice, cluster):
    import signal

    from jobs import queues

    agent = cluster.agent("t-node-b")
    # Killed, not stopped: a stopping agent takes its node out of placement,
    # while a crashed one keeps it for a few heartbeats, and its queue fills
    # up while it is away.
    agent.stop(signal.SIGKILL)
    job = submit(alice, config("flush", role(command="echo survived", gpus=1), gpuType="TITANX"))
    wait_state(job, State.RUNNING)
    queues.connection().flushdb()
    cluster.start_agent("t-node-b", ports=cluster.port_range(1), gpus=2, gpu_type="TITANX")
    job = wait_state(job, State.SUCCEEDED, timeout=60)
    assert lines(job) == ["survived"]


def test_it_fails_the_tasks_of_a_lost_node(alice, cluster):
    import signal

    cluster.start_agent("t-node-lost", ports=cluster.port_range(2), gpus=1, gpu_type="LOSTTEST")
    job = wait_state(submit(alice, config("lost", role(command="sleep 600", gpus=1), gpuType="LOSTTEST")), State.RUNNING)
    wait_for(lambda: TaskAttempt.objects.filter(job=job, state="RUNNING").exists(), what="the task to run")
    container_id = TaskAttempt.objects.get(job=job).container_id
    cluster.agent("t-node-lost").stop(signal.SIGKILL)
    job = wait_state(job, State.FAILED, timeout=60)
    assert job.exit_type == ExitType.NODE_LOST
    assert "t-node-lost was lost" in job.exit_reason
    # The container outlived its agent, still holding its host ports. The
    # agent, back, removes it: its task already ended as "node lost".
    engine = docker.from_env()
    assert engine.containers.get(container_id).status == "running"
    cluster.start_agent("t-node-lost", ports=cluster.port_range(2), gpus=1, gpu_type="LOSTTEST")

    def removed() -> bool:
        try:
            engine.containers.get(container_id)
        except docker.errors.NotFound:
            return True
        return False

    wait_for(removed, timeout=30, what="the returning agent to remove the lost task's container")
    cluster.agent("t-node-lost").stop()


def test_it_reports_a_failed_image_pull(alice, cluster, settings):
    # A loopback registry (nothing listens on port 1) is refused unless the
    # admin opens it: here for submission (this process) and one agent. It
    # cannot be reached: asked again for IMAGE_PULL_REGISTRY_WAIT_SECONDS
    # (3 s here), then the task fails saying so (finding 46).
    settings.REGISTRY_ALLOWED = ["127.0.0.1:1"]
    cluster.start_agent("t-node-pull", ports=cluster.port_range(5), gpus=1, gpu_type="PULLTEST",
                        env={"REGISTRY_ALLOWED": "127.0.0.1:1", "IMAGE_PULL_REGISTRY_WAIT_SECONDS": "3"})
    image = "127.0.0.1:1/no/such-image:1"
    try:
        job = wait_state(submit(alice, config("nopull", role(gpus=1), image=image, gpuType="PULLTEST")), State.FAILED,
                         timeout=60)
    finally:  # its name and ports are other tests' too
        cluster.agent("t-node-pull").stop()
    assert job.exit_type == ExitType.IMAGE_PULL
    assert f"could not pull image {image}: " in job.exit_reason and "connection refused" in job.exit_reason
    assert "could not be reached for 3 s (IMAGE_PULL_REGISTRY_WAIT_SECONDS)" in job.exit_reason, job.exit_reason


def test_it_truncates_a_huge_log_and_lets_the_task_go_on(alice, cluster):
    # A node agent of its own, with a small cap on stored log bytes.
    cluster.start_agent("t-node-cap", ports=cluster.port_range(3), gpus=1, gpu_type="CAPTEST",
                        env={"LOG_MAX_BYTES_PER_TASK": "20000"})
    command = "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); echo line $i; done; echo still alive >&2"
    job = wait_state(submit(alice, config("cap", role(command=command, gpus=1), gpuType="CAPTEST")), State.SUCCEEDED)
    out = lines(job)
    assert out[-1].startswith("[log truncated")
    assert out[0] == "line 1" and len(out) < 3000
    assert lines(job, Stream.STDERR) == ["still alive"]
    assert LogCursor.objects.get(attempt__job=job, stream=Stream.STDOUT).truncated
    cluster.agent("t-node-cap").stop()


def test_it_keeps_one_task_jobs_apart_on_the_shared_network_when_asked(alice, cluster):
    """SINGLE_TASK_NETWORK=shared: our network even when the engine's default
    bridge would do (that path, on the engine the tests start:
    tests/security/test_container_isolation.py)."""
    cluster.start_agent("t-node-iso", ports=cluster.port_range(4), gpus=2, gpu_type="ISOTEST",
                        env={"SINGLE_TASK_NETWORK": "shared"})
    try:
        _one_task_jobs_apart(alice)
    finally:
        stop_node_agent(cluster, "t-node-iso")


def _one_task_jobs_apart(alice) -> None:
    server = wait_state(submit(alice, config("listener", role(command="nc -l -p 5000", gpus=1), gpuType="ISOTEST")),
                        State.RUNNING)
    container_id = running_attempt(server, timeout=30).container_id
    networks = docker.from_env().api.inspect_container(container_id)["NetworkSettings"]["Networks"]
    shared = f"{settings.PAI_INSTANCE}-shared"
    assert list(networks) == [shared]
    address = networks[shared]["IPAddress"]
    probe = f"echo hi | timeout 4 nc -w 2 {address} 5000; [ $? = 1 ] && echo unreachable || echo reached"
    client = wait_state(submit(alice, config("prober", role(command=probe, gpus=1), gpuType="ISOTEST")), State.SUCCEEDED)
    assert lines(client) == ["unreachable"]
    # Stopped while its agent runs: a container left running by a stopped
    # agent keeps its published ports, which later tests' agents on this
    # port range would be refused by Docker.
    services.job_stop(job=server, by=alice)
    wait_state(server, State.STOPPED)
    wait_for(lambda: not docker.from_env().containers.list(all=True, filters={"id": container_id}),
             timeout=30, what="the listener's container to be removed")


def test_it_refuses_a_virtual_cluster_the_user_may_not_use(alice, admin_user):
    from jobs.models import VirtualCluster

    VirtualCluster.objects.get_or_create(name="private_vc")  # no capacity: takes nothing from default
    with pytest.raises(services.SubmitError) as refused:
        submit(alice, config("novc", role(), virtualCluster="private_vc"))
    assert refused.value.code == "ForbiddenUserError" and refused.value.field == "virtualCluster"
    with pytest.raises(services.SubmitError) as missing:
        submit(alice, config("novc", role(), virtualCluster="no_such_vc"))
    assert missing.value.code == "NoVirtualClusterError" and "default" in missing.value.message
    job = submit(admin_user, config("adminvc", role(command="true"), virtualCluster="private_vc"))
    assert job.virtual_cluster.name == "private_vc"
    services.job_stop(job=job, by=admin_user)


def test_it_shows_why_a_job_waits_and_its_place_in_the_queue(alice):
    # Node b's two TITANX GPUs are held; two more jobs queue for them.
    holder = wait_state(submit(alice, config("holder", role(command="sleep 600", gpus=2), gpuType="TITANX")), State.RUNNING)
    first = submit(alice, config("queued1", role(command="true", gpus=2), gpuType="TITANX"))
    second = submit(alice, config("queued2", role(command="true", gpus=1), gpuType="TITANX"))
    wait_for(lambda: "TITANX" in type(second).objects.get(pk=second.pk).waiting_reason, what="a reason to wait")
    first.refresh_from_db()
    assert first.waiting_reason.startswith("needs 1 task of role main with 1 CPU, 256 MB memory, 2 GPUs of type TITANX")
    assert "virtual cluster 'default' has" in first.waiting_reason
    assert services.queue_position(first) < services.queue_position(second)
    services.job_stop(job=holder, by=alice)
    wait_state(first, State.SUCCEEDED, timeout=60)


def test_it_kills_a_task_that_ignores_sigterm_after_the_grace_period(alice):
    job = wait_state(submit(alice, config("stubborn", role(command="trap '' TERM; echo ready; sleep 600"))), State.RUNNING)
    wait_for(lambda: lines(job) == ["ready"], what="the task to print")
    services.job_stop(job=job, by=alice)
    job = wait_state(job, State.STOPPED, timeout=30)
    took = (job.finished_at - job.stop_requested_at).total_seconds()
    assert took >= settings.STOP_GRACE_SECONDS - 0.5, f"stopped after {took:.1f} s, before the grace period"
    assert job.exit_type == ExitType.USER_STOP


def test_it_records_an_exit_that_happened_while_the_agent_was_down(alice, cluster):
    import signal

    job = wait_state(submit(alice, config("exitdown", role(command="sleep 3; echo bye; exit 4", gpus=1),
                                          gpuType="TITANX")), State.RUNNING)
    attempt = running_attempt(job, timeout=30)
    cluster.agent("t-node-b").stop(signal.SIGKILL)
    client = docker.from_env()
    wait_for(lambda: client.containers.get(attempt.container_id).status == "exited", timeout=30, what="the exit")
    cluster.start_agent("t-node-b", ports=cluster.port_range(1), gpus=2, gpu_type="TITANX")
    job = wait_state(job, State.FAILED, timeout=60)
    assert job.exit_code == 4 and lines(job) == ["bye"]


def test_it_removes_an_orphan_container_of_its_node(cluster):
    client = docker.from_env()
    orphan = client.containers.run("pai-local/busybox:latest", ["sleep", "600"], detach=True, labels={
        "pai.instance": settings.PAI_INSTANCE, "pai.node": "t-node-a", "pai.task-attempt": "987654321"})

    def gone() -> bool:
        try:
            client.containers.get(orphan.id)
        except docker.errors.NotFound:
            return True
        return False

    wait_for(gone, timeout=30, what="reconciliation to remove the orphan")


def test_it_runs_code_from_a_folder_given_relative_to_the_users_home(alice):
    code = settings.STORAGE_LOCAL_ROOT / alice.username / "code"
    code.mkdir(parents=True)
    (code / "train.sh").write_text("echo training in $(pwd) with $PAI_CODE_DIR\n")
    job = wait_state(submit(alice, config("relcode", role(command="sh train.sh"), codeDir="code")), State.SUCCEEDED)
    assert job.config_raw.count('"codeDir": "code"') == 1  # as submitted
    assert job.config["codeDir"] == f"file:///{alice.username}/code"
    assert lines(job) == [f"training in /pai/work with file:///{alice.username}/code"]


def test_it_places_nothing_on_a_node_whose_agent_stopped(alice, cluster):
    cluster.start_agent("t-node-leave", ports=cluster.port_range(5), gpus=1, gpu_type="LEAVETEST")
    cluster.agent("t-node-leave").stop()
    job = submit(alice, config("afterleave", role(command="true", gpus=1), gpuType="LEAVETEST"))
    wait_for(lambda: "LEAVETEST" in type(job).objects.get(pk=job.pk).waiting_reason, what="a reason to wait")
    job.refresh_from_db()
    assert job.state == State.WAITING and not TaskAttempt.objects.filter(job=job).exists()
    cluster.start_agent("t-node-leave", ports=cluster.port_range(5), gpus=1, gpu_type="LEAVETEST")
    assert wait_state(job, State.SUCCEEDED).exit_type == ExitType.SUCCEEDED
    cluster.agent("t-node-leave").stop()


def test_it_makes_the_output_folder_as_the_first_task_starts_not_at_submission(alice):
    output = settings.STORAGE_LOCAL_ROOT / "Output" / alice.username
    held = submit(alice, config("outlater", role(command="true", gpus=1), gpuType="NOSUCHGPU"))
    wait_for(lambda: "NOSUCHGPU" in type(held).objects.get(pk=held.pk).waiting_reason, what="a reason to wait")
    assert not (output / "outlater").exists()  # a job that never starts leaves no folder behind
    services.job_stop(job=held, by=alice)

    job = submit(alice, config("outnow", role(command="echo started; sleep 600")))
    running_attempt(job)
    assert (output / "outnow").is_dir()  # there before the task's code runs: it may write to PAI_OUTPUT_DIR
    services.job_stop(job=job, by=alice)
    wait_state(job, State.STOPPED, timeout=30)


def test_it_starts_the_task_with_a_note_when_the_output_folder_cannot_be_made(alice, cluster):
    output = settings.STORAGE_LOCAL_ROOT / "Output" / alice.username
    job = submit(alice, config("outblocked", role(command="echo ran", gpus=1), gpuType="OUTBLOCKED"))
    # Submission found nothing in the way; a file appears there before the job starts.
    output.mkdir(parents=True, exist_ok=True)
    (output / "outblocked").write_text("not a folder")
    cluster.start_agent("t-node-outblocked", ports=cluster.port_range(5), gpus=1, gpu_type="OUTBLOCKED")
    try:
        job = wait_state(job, State.SUCCEEDED)
    finally:
        cluster.agent("t-node-outblocked").stop()
    assert lines(job) == ["ran"]
    uri = f"file:///Output/{alice.username}/outblocked"
    notes = [line.split(" ", 2)[2] for line in lines(job, Stream.PLATFORM)]  # after the note's date and time
    assert f"could not make outputDir {uri}: {uri} is a file; expected a folder" in notes, notes
