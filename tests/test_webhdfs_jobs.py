"""Jobs on HDFS end to end: node agents and gunicorn of their own, all with
STORAGE_BACKEND=webhdfs on the session's minicluster (tests/hdfs_cluster.py),
real containers. A job's codeDir and dataDir are fetched from HDFS as its
owner (to /pai/code and /pai/data), the task's /pai/output lands in
outputDir on HDFS, owned by them, and downloads from the job's folder on
the storage page; submitted through the service layer with hdfs:// URIs and
through the REST API with $PAI_DEFAULT_FS_URI. With the namenode stopped:
submission is refused, staging fails, and an output upload waits for HDFS
to come back (or, past its retry time or once the job is stopped, is kept
on the node), each saying that HDFS did not answer; the node agent removes
kept outputs past OUTPUT_KEEP_HOURS. With HDFS frozen, one user's stagings
that hang do not hold every launch thread of a node.

Containers here cannot reach the namenode (it listens on 127.0.0.1 only,
and job networks are isolated): a task reads its data from /pai/data;
dataDir still reaches it as PAI_DATA_DIR, a full hdfs:// URI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import docker
import pytest
from django.conf import settings
from django.test import override_settings

from jobs import services, storage
from jobs.models import State, Stream, TaskAttempt, TaskState
from jobs.node import launcher
from jobs.node.runner import LAUNCH_THREADS
from jobs.node.staging import kept_root
from jobs.spec import SpecError
from tests.cluster import Cluster, wait_for
from tests.helpers import config, lines, login, role, stop_node_agent, submit, wait_state
from tests.test_api import expect
from tests.test_api import login as api_login

pytestmark = pytest.mark.services

GPU_TYPE = "HDFSNODE"  # only this module's agents have these: its jobs land there and nowhere else
GIVE_UP_GPU_TYPE = "HDFSGIVEUP"  # the agent that retries an output upload for 8 s only
GIVE_UP_SECONDS = 8

RUN_SH = """echo "words in the data: $(cat /pai/data/words.txt | wc -w)"
echo "data is $PAI_DATA_DIR"
wc -w < /pai/data/words.txt > /pai/output/count.txt
echo "output goes to $PAI_OUTPUT_DIR" > /pai/output/where.txt
"""


@pytest.fixture(scope="module")
def hdfs_portal(hdfs_cluster, redis_server, docker_engine, static_files) -> Iterator[Cluster]:
    """Two node agents and gunicorn, all on HDFS. The first retries an output
    upload for the default ten minutes, the second gives up after a few seconds."""
    running = Cluster()
    env = hdfs_cluster.portal_settings()
    try:
        running.start_agent("t-node-hdfs", ports=running.port_range(2), gpus=1, gpu_type=GPU_TYPE, env=env)
        running.start_agent("t-node-hdfs-giveup", ports=running.port_range(3), gpus=1, gpu_type=GIVE_UP_GPU_TYPE,
                            env={**env, "OUTPUT_UPLOAD_RETRY_SECONDS": str(GIVE_UP_SECONDS)})
        running.start_portal(name="gunicorn-hdfs", env=env)
        yield running
    finally:
        running.stop_all()


@pytest.fixture(autouse=True)
def on_real_hdfs(hdfs_cluster):
    """This process (job_submit, uploads here) on the same HDFS as the portal."""
    with override_settings(**hdfs_cluster.portal_settings()):
        yield hdfs_cluster


def upload_project(tmp_path: Path, user) -> None:
    """/<user>/proj (the code) and /<user>/data (the data), as the user."""
    project, data = tmp_path / "proj", tmp_path / "data"
    project.mkdir(exist_ok=True)
    data.mkdir(exist_ok=True)
    (project / "run.sh").write_text(RUN_SH)
    (data / "words.txt").write_text("one two three four five\n")
    owner = storage.reader_for(user_name=user.username, is_admin=False)
    storage.upload_tree(project, f"/{user.username}/proj", reader=owner)
    storage.upload_tree(data, f"/{user.username}/data", reader=owner)


def job_config(name: str, *, gpu_type: str = GPU_TYPE, **folders: str) -> dict:
    folders.setdefault("dataDir", "data")
    return config(name, role(command="sh run.sh", gpus=1), gpuType=gpu_type, **folders)


def test_it_runs_a_job_whose_folders_are_on_hdfs_and_serves_its_output(
        hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    fs, home = hdfs_cluster.fs_uri, f"/{alice.username}"
    upload_project(tmp_path, alice)
    cfg = job_config("onhdfs", codeDir=f"{fs}{home}/proj", dataDir=f"{fs}{home}/data",
                     outputDir=f"{fs}/Output/{alice.username}/onhdfs")
    job = wait_state(services.job_submit(owner=alice, config=json.dumps(cfg), upload_outputs=True),
                     State.SUCCEEDED, timeout=120)
    assert lines(job) == ["words in the data: 5", f"data is {fs}{home}/data"]

    output = f"/Output/{alice.username}/onhdfs"
    assert hdfs_cluster.read(f"{output}/count.txt", user=alice.username).strip() == b"5"
    assert hdfs_cluster.read(f"{output}/where.txt") == f"output goes to {fs}{output}\n".encode()
    assert hdfs_cluster.status(f"{output}/count.txt")["owner"] == alice.username  # uploaded as alice

    web = login(hdfs_portal.base_url, alice)
    page = web.get(f"{hdfs_portal.base_url}/jobs/{job.pk}/", timeout=30).text
    link = f"/storage/?path={quote(output, safe='')}"
    assert re.search(rf'data-storage-link="outputDir"[^>]*href="{re.escape(link)}"|href="{re.escape(link)}"[^>]*data-storage-link="outputDir"', page)
    folder = web.get(hdfs_portal.base_url + link, timeout=30).text
    assert f"{fs}{output}" in folder and "count.txt" in folder
    download = web.get(f"{hdfs_portal.base_url}/storage/download/", params={"path": f"{output}/count.txt"}, timeout=30)
    assert download.status_code == 200 and download.content.strip() == b"5"


def test_it_runs_a_job_submitted_through_the_rest_api_with_the_default_fs_uri(
        hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    upload_project(tmp_path, alice)
    cfg = job_config("viaapi", codeDir="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/proj",
                     dataDir="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/data",
                     outputDir="$PAI_DEFAULT_FS_URI/Output/$PAI_USER_NAME/viaapi", extras={"uploadOutputs": True})
    api = api_login(hdfs_portal.base_url, alice)
    expect(api.post(f"/user/{alice.username}/jobs", cfg), 202)
    job = wait_state(alice.jobs.get(name="viaapi"), State.SUCCEEDED, timeout=120)
    fs = hdfs_cluster.fs_uri
    assert job.config["codeDir"] == f"{fs}/{alice.username}/proj"
    assert lines(job)[-1] == f"data is {fs}/{alice.username}/data"
    assert hdfs_cluster.read(f"/Output/{alice.username}/viaapi/count.txt").strip() == b"5"
    described = expect(api.get(f"/user/{alice.username}/jobs/viaapi/config"), 200)
    assert described["outputDir"].startswith("$PAI_DEFAULT_FS_URI/Output/") or described["outputDir"].startswith(fs)


# ------------------------------------------------- when the namenode is down

def running_attempt(job) -> bool:
    return TaskAttempt.objects.filter(job=job, state=TaskState.RUNNING).exists()


def test_it_refuses_a_submission_while_hdfs_is_down_saying_so(hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    upload_project(tmp_path, alice)
    fs, home = hdfs_cluster.fs_uri, f"/{alice.username}"
    api = api_login(hdfs_portal.base_url, alice)
    web = login(hdfs_portal.base_url, alice)
    web.get(f"{hdfs_portal.base_url}/storage/", timeout=30)  # a CSRF cookie
    hdfs_cluster.stop()
    try:
        # The storage page and an upload say so too (503), and store nothing.
        said = f"HDFS at {hdfs_cluster.url} did not answer (ConnectionError)"
        page = web.get(f"{hdfs_portal.base_url}/storage/", timeout=30)
        assert page.status_code == 503 and said in page.text
        upload = web.post(f"{hdfs_portal.base_url}/storage/upload/", files=[("files", ("late.txt", b"late"))],
                          data={"path": home}, timeout=30,
                          headers={"Accept": "application/json", "X-CSRFToken": web.cookies["csrftoken"],
                                   "Referer": f"{hdfs_portal.base_url}/storage/"})
        assert upload.status_code == 503 and upload.json()["error"] == said
        with pytest.raises(SpecError) as error:
            services.job_submit(owner=alice, config=json.dumps(job_config("down", codeDir=f"{fs}{home}/proj")))
        problems = {p.path: p.message for p in error.value.problems}
        assert problems["codeDir"] == f"HDFS at {hdfs_cluster.url} did not answer (ConnectionError)"
        refused = expect(api.post(f"/user/{alice.username}/jobs", job_config("down", codeDir="proj")), 400,
                         "InvalidParametersError")
        assert "did not answer" in refused["message"]
    finally:
        hdfs_cluster.start()
    # Back: the same submission goes through, with no restart of anything.
    expect(api.post(f"/user/{alice.username}/jobs", job_config("down", codeDir="proj")), 202)
    assert hdfs_cluster.status(f"{home}/late.txt") is None


def test_it_waits_for_hdfs_to_upload_an_output_and_then_uploads_it(
        hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    upload_project(tmp_path, alice)
    cfg = job_config("waitsforhdfs", codeDir="proj")
    cfg["taskRoles"][0]["command"] = "sleep 3; sh run.sh"
    job = services.job_submit(owner=alice, config=json.dumps(cfg), upload_outputs=True)
    wait_for(lambda: running_attempt(job), timeout=90, what="the job's container to run")
    hdfs_cluster.stop()
    try:
        output = f"{hdfs_cluster.fs_uri}/Output/{alice.username}/waitsforhdfs"
        said = (f"could not upload /pai/output to {output}: HDFS at {hdfs_cluster.url} did not answer "
                "(ConnectionError); /pai/output is kept, trying again in 2 s")
        wait_for(lambda: any(n.endswith(said) for n in lines(job, Stream.PLATFORM)), timeout=60,
                 what="the task's platform log to say the upload waits for HDFS")
        job.refresh_from_db()
        assert job.state == State.RUNNING  # the task is not over until its output is stored
    finally:
        hdfs_cluster.start()
    job = wait_state(job, State.SUCCEEDED, timeout=180)
    assert hdfs_cluster.read(f"/Output/{alice.username}/waitsforhdfs/count.txt").strip() == b"5"
    assert any(re.search(rf"uploaded /pai/output \(\d+ bytes\) to {re.escape(output)}$", n)
               for n in lines(job, Stream.PLATFORM))


def test_it_says_hdfs_did_not_answer_keeps_what_is_stored_and_works_again_when_it_is_back(
        hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    upload_project(tmp_path, alice)
    fs, home = hdfs_cluster.fs_uri, f"/{alice.username}"
    # The give-up node's one GPU goes to `running` first; `queued` waits for
    # it, so HDFS stops after `running` fetched its code and data and before
    # `queued` can: `running` cannot upload its output (kept on the node
    # after a few seconds of retries), `queued` cannot stage.
    slow = job_config("running", gpu_type=GIVE_UP_GPU_TYPE, codeDir=f"{fs}{home}/proj")
    slow["taskRoles"][0]["command"] = "sleep 3; sh run.sh"
    running = services.job_submit(owner=alice, config=json.dumps(slow), upload_outputs=True)
    queued = services.job_submit(owner=alice, config=json.dumps(
        job_config("queued", gpu_type=GIVE_UP_GPU_TYPE, codeDir="proj")), upload_outputs=True)
    wait_for(lambda: running_attempt(running), timeout=90, what="the first job's container to run")
    hdfs_cluster.stop()
    try:
        running = wait_state(running, State.SUCCEEDED, timeout=120)  # the command's own result stands
        notes = lines(running, Stream.PLATFORM)
        said = (f"could not upload /pai/output to {fs}/Output/{alice.username}/running: HDFS at {hdfs_cluster.url} "
                f"did not answer (ConnectionError); tried ")
        kept_note = next((n for n in notes if said in n), None)
        assert kept_note is not None, notes
        assert f"over {GIVE_UP_SECONDS} s (OUTPUT_UPLOAD_RETRY_SECONDS). It is kept on this task's node in " in kept_note
        kept = Path(re.search(r"node in (\S+) until", kept_note).group(1))
        assert (kept / "count.txt").read_text().strip() == "5"  # the output is not lost
        queued = wait_state(queued, State.FAILED, timeout=60)
        assert queued.exit_reason.endswith(f"could not fetch codeDir {fs}{home}/proj: HDFS at {hdfs_cluster.url} "
                                           "did not answer (ConnectionError)"), queued.exit_reason
    finally:
        hdfs_cluster.start()

    # Back: what was stored is there, and new jobs run with no restart of the agent or gunicorn.
    assert hdfs_cluster.read(f"{home}/data/words.txt", user=alice.username) == b"one two three four five\n"
    again = wait_state(services.job_submit(owner=alice, config=json.dumps(
        job_config("backagain", gpu_type=GIVE_UP_GPU_TYPE, codeDir="proj")), upload_outputs=True),
        State.SUCCEEDED, timeout=120)
    assert lines(again)[0] == "words in the data: 5"
    assert hdfs_cluster.read(f"/Output/{alice.username}/backagain/count.txt").strip() == b"5"


def test_a_stop_ends_the_wait_for_hdfs_and_keeps_the_output_on_the_node(
        hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    """This node would retry the upload for ten minutes (the default
    OUTPUT_UPLOAD_RETRY_SECONDS); the user's stop ends the wait: the output
    is kept on the node at once, and the job ends stopped."""
    upload_project(tmp_path, alice)
    cfg = job_config("stopwhilewaiting", codeDir="proj")
    cfg["taskRoles"][0]["command"] = "sleep 3; sh run.sh"
    job = services.job_submit(owner=alice, config=json.dumps(cfg), upload_outputs=True)
    wait_for(lambda: running_attempt(job), timeout=90, what="the job's container to run")
    output = f"{hdfs_cluster.fs_uri}/Output/{alice.username}/stopwhilewaiting"
    did_not_answer = (f"could not upload /pai/output to {output}: HDFS at {hdfs_cluster.url} "
                      "did not answer (ConnectionError)")
    hdfs_cluster.stop()
    try:
        wait_for(lambda: any(n.endswith(f"{did_not_answer}; /pai/output is kept, trying again in 2 s")
                             for n in lines(job, Stream.PLATFORM)),
                 timeout=60, what="the task's platform log to say the upload waits for HDFS")
        services.job_stop(job=job, by=alice)
        job = wait_state(job, State.STOPPED, timeout=60)  # a tenth of the retry time
        notes = lines(job, Stream.PLATFORM)
        kept_note = next((n for n in notes if did_not_answer in n and "It is kept" in n), None)
        assert kept_note is not None, notes
        assert re.search(r"; tried \d+ times, then the job was stopped\. It is kept on this task's node in ", kept_note)
        kept = Path(re.search(r"node in (\S+) until", kept_note).group(1))
        assert (kept / "count.txt").read_text().strip() == "5"  # the output is not lost
        assert kept.parent.parent == kept_root()
    finally:
        hdfs_cluster.start()
    # Kept, not uploaded: no try after the stop.
    assert hdfs_cluster.status(f"/Output/{alice.username}/stopwhilewaiting/count.txt") is None


def test_the_node_agent_removes_kept_outputs_past_output_keep_hours(hdfs_portal, tmp_path: Path) -> None:
    """On its own, every RECONCILE_SECONDS: not only when the node next
    stages or uploads something (nothing does here)."""
    old, fresh = kept_root() / f"sweep-old-{tmp_path.name}", kept_root() / f"sweep-fresh-{tmp_path.name}"
    for folder in (old, fresh):
        (folder / "output").mkdir(parents=True)
        (folder / "output" / "model.txt").write_text("weights")
    past = time.time() - settings.OUTPUT_KEEP_HOURS * 3600 - 60
    os.utime(old, (past, past))
    try:
        wait_for(lambda: not old.exists(), timeout=30,
                 what="the node agent to remove the kept output past OUTPUT_KEEP_HOURS")
        assert (fresh / "output" / "model.txt").read_text() == "weights"
    finally:
        for folder in (old, fresh):
            shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------ stagings that hang, and another user

FAIR_NODE, FAIR_GPU_TYPE = "t-node-hdfs-fair", "HDFSFAIR"


def test_one_users_stagings_that_hang_leave_a_launch_thread_to_another_users_task(
        hdfs_portal, hdfs_cluster, alice, bob, tmp_path: Path) -> None:
    """A launch stages its job's codeDir on its launch thread. Alice's job of
    LAUNCH_THREADS tasks whose codeDir could not be read (HDFS frozen: it
    takes connections and answers nothing, up to the client's two-minute
    read timeout) held every launch thread of the node, and Bob's task,
    placed just after, waited for them. One owner now holds at most
    LAUNCHES_PER_OWNER of them (jobs/node/launch_queue.py), and Bob's launch
    goes ahead: its container is made while its outputDir (on the same
    frozen HDFS) is, and it runs once HDFS answers."""
    upload_project(tmp_path, alice)
    hdfs_portal.start_agent(FAIR_NODE, ports=hdfs_portal.port_range(5), gpus=LAUNCH_THREADS + 1,
                            gpu_type=FAIR_GPU_TYPE, env=hdfs_cluster.portal_settings())
    frozen = False
    try:
        # The node's GPUs held, so that both jobs are placed by one pass once
        # HDFS is frozen, alice's tasks first (submissions look at storage,
        # so they come before).
        blocker = submit(bob, config("fair-blocker", role(command="sleep 600", gpus=LAUNCH_THREADS + 1),
                                     gpuType=FAIR_GPU_TYPE))
        wait_state(blocker, State.RUNNING, timeout=60)
        hung = submit(alice, config("fair-hung", role(command="sh run.sh", gpus=1, tasks=LAUNCH_THREADS),
                                    gpuType=FAIR_GPU_TYPE, codeDir=f"{hdfs_cluster.fs_uri}/{alice.username}/proj"))
        other = submit(bob, config("fair-other", role(command="echo other ran", gpus=1), gpuType=FAIR_GPU_TYPE))
        os.kill(hdfs_cluster.popen.pid, signal.SIGSTOP)
        frozen = True
        services.job_stop(job=blocker, by=bob)

        engine = docker.from_env()
        try:
            attempt = wait_for(lambda: TaskAttempt.objects.filter(job=other).first(), timeout=60,
                               what="bob's task to be placed")

            def made() -> bool:
                return bool(engine.containers.list(all=True, filters={
                    "label": f"{launcher.LABEL_TASK_ATTEMPT}={attempt.pk}"}))

            wait_for(made, timeout=60, what="bob's container to be made while alice's stagings hang")
        except AssertionError as exc:
            attempts = list(TaskAttempt.objects.filter(job__in=[blocker, hung, other])
                            .values_list("job__name", "state", "node_name"))
            raise AssertionError(f"{exc}\ntask attempts: {attempts}\nthe agent's log:\n"
                                 f"{hdfs_portal.agent(FAIR_NODE).log_tail(80)}") from exc
        states = set(TaskAttempt.objects.filter(job=hung).values_list("state", flat=True))
        assert states == {TaskState.LAUNCHING}  # still staging, all of them

        os.kill(hdfs_cluster.popen.pid, signal.SIGCONT)
        frozen = False
        other = wait_state(other, State.SUCCEEDED, State.FAILED, timeout=120)
        assert other.state == State.SUCCEEDED, other.exit_reason
        assert lines(other) == ["other ran"]
    finally:
        if frozen:
            os.kill(hdfs_cluster.popen.pid, signal.SIGCONT)
        stop_node_agent(hdfs_portal, FAIR_NODE)
