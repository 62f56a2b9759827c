"""Finding 7: nothing bounded the disk a user could fill. /pai/output was
uploaded whatever its size, storage had no quota, and logs were capped per
stream and attempt only, with an empty line costing a database row for one
byte. Now each user has a storage quota (bytes and files over /<user> and
/Output/<user>) checked on every write, a task's output upload stops at
per-task limits (whole files that fit are uploaded, the platform log says
why the rest was not), and a job's logs stop, with a marker, at a limit
over all its tasks, streams and attempts in bytes and in rows."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from jobs import services, storage
from jobs.models import Job, JobAttempt, LogLine, State, Stream, Task, TaskAttempt, TaskState, VirtualCluster
from jobs.node.launcher.docker import DockerEngine
from jobs.node.logwriter import LogWriter
from jobs.node.staging import upload_output
from jobs.spec import parse_job_value
from tests.cluster import Cluster
from tests.helpers import config, lines, role, wait_state
from tests.services import BUSYBOX_IMAGE
from tests.settings import TEST_ENV
from tests.test_storage import hdfs_server, on_hdfs  # noqa: F401  (fixtures)

KB = 1024


def _upload(client: Client, folder: str, name: str, size: int):
    return client.post("/storage/upload/", {"path": folder, "files": [SimpleUploadedFile(name, b"x" * size)]},
                       HTTP_ACCEPT="application/json")


# ------------------------------------------------------------ the quota

def test_it_refuses_an_upload_past_the_quota_naming_it_and_what_is_used(alice, alice_client, settings):
    settings.STORAGE_QUOTA_MB, settings.STORAGE_QUOTA_FILES = 1, 2
    home = f"/{alice.username}"
    assert _upload(alice_client, home, "first.bin", 600 * KB).status_code == 200
    refused = _upload(alice_client, home, "second.bin", 600 * KB)
    assert refused.status_code == 413
    assert refused.json()["error"] == (
        f"storage quota exceeded: /{alice.username} and /Output/{alice.username} hold 0.6 MB in 1 files, this would "
        "add 0.6 MB in 1 files, and the quota is 1.0 MB (STORAGE_QUOTA_MB) and 2 files (STORAGE_QUOTA_FILES); "
        "delete files to make room")
    assert storage.backend().stat(f"{home}/first.bin").size == 600 * KB  # what was stored stays
    assert storage.backend().stat(f"{home}/second.bin") is None

    # Outputs count too, and a delete makes room at once.
    assert _upload(alice_client, f"/Output/{alice.username}", "out.bin", 300 * KB).status_code == 200
    assert _upload(alice_client, home, "small.bin", 200 * KB).status_code == 413
    alice_client.post("/storage/delete/", {"path": f"{home}/first.bin"})
    assert _upload(alice_client, home, "small.bin", 200 * KB).status_code == 200
    # Files are counted as well as bytes.
    assert _upload(alice_client, home, "tiny.bin", 1).status_code == 413
    assert "2 files (STORAGE_QUOTA_FILES)" in _upload(alice_client, home, "tiny.bin", 1).json()["error"]


def test_it_refuses_uploads_into_another_users_folder_and_from_an_anonymous_client(alice, bob):
    stranger = Client()
    stranger.force_login(bob)
    assert _upload(stranger, f"/{alice.username}", "x.bin", 10).status_code == 403
    anonymous = Client().post("/storage/upload/", {"path": f"/{alice.username}"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert storage.backend().stat(f"/{alice.username}/x.bin") is None


def test_it_measures_hdfs_usage_with_the_namenodes_content_summary(on_hdfs, alice, alice_client, settings):  # noqa: F811
    settings.STORAGE_QUOTA_MB, settings.STORAGE_QUOTA_FILES = 1, 0
    assert _upload(alice_client, f"/{alice.username}", "a.bin", 700 * KB).status_code == 200
    assert storage.backend().usage(f"/{alice.username}") == (700 * KB, 1)
    refused = _upload(alice_client, f"/{alice.username}", "b.bin", 400 * KB)
    assert refused.status_code == 413 and "hold 0.7 MB in 1 files" in refused.json()["error"]
    assert any(r.op == "GETCONTENTSUMMARY" for r in on_hdfs.requests)


# ----------------------------------------------------- a task's /pai/output

@pytest.fixture
def stopped_task(docker_engine):
    """A stopped busybox container that left five 400 KB files in /pai/output."""
    import docker

    client = docker.from_env()
    command = "mkdir -p /pai/output && for i in 1 2 3 4 5; do head -c 409600 /dev/zero > /pai/output/f$i; done"
    container = client.containers.run(BUSYBOX_IMAGE, ["sh", "-c", command], detach=True,
                                      labels={"pai.instance": TEST_ENV["PAI_INSTANCE"]})
    try:
        assert container.wait(timeout=60)["StatusCode"] == 0
        yield container.id
    finally:
        container.remove(force=True)


def test_it_uploads_the_output_that_fits_and_says_why_the_rest_was_not(alice, stopped_task, settings):
    engine = DockerEngine(django_settings.DOCKER_HOST)
    target = f"file:///Output/{alice.username}/by-files"
    settings.OUTPUT_MAX_FILES_PER_TASK = 3
    note = upload_output(engine, stopped_task, target)
    assert re.fullmatch(rf"uploaded 3 files of /pai/output \(1228800 bytes\) to {target}; the rest was not uploaded: "
                        r"/pai/output/f\d would pass the limit of 3 files per task \(OUTPUT_MAX_FILES_PER_TASK\)", note)
    assert len(storage.backend().list(f"/Output/{alice.username}/by-files")) == 3

    settings.OUTPUT_MAX_FILES_PER_TASK, settings.OUTPUT_MAX_MB_PER_TASK = 100, 1
    target = f"file:///Output/{alice.username}/by-bytes"
    note = upload_output(engine, stopped_task, target)
    assert re.fullmatch(rf"uploaded 2 files of /pai/output \(819200 bytes\) to {target}; the rest was not uploaded: "
                        r"/pai/output/f\d \(409600 bytes\) would pass the limit of 1 MB per task "
                        r"\(OUTPUT_MAX_MB_PER_TASK\)", note)

    # The owner's quota binds when it has less room than the task's limit.
    settings.OUTPUT_MAX_MB_PER_TASK, settings.STORAGE_QUOTA_FILES = 100, 6
    target = f"file:///Output/{alice.username}/by-quota"
    note = upload_output(engine, stopped_task, target)
    assert note.endswith("would pass the 1 files left in the job owner's storage quota")
    note = upload_output(engine, stopped_task, f"file:///Output/{alice.username}/none")
    assert note.startswith(f"nothing of /pai/output was uploaded to file:///Output/{alice.username}/none: /pai/output/f")


# ------------------------------- the same limits on a node agent's real jobs

DISK_GPU_TYPE = "DISKTEST"  # only this agent has it: the jobs below run there and nowhere else
DISK_NODE = "t-node-disk"
JOB_ROWS = 100  # LOG_MAX_ROWS_PER_JOB's smallest value


@pytest.fixture(scope="module")
def disk_node(cluster: Cluster) -> Iterator[str]:
    """A node agent with small limits, set as a deployment sets them: its environment."""
    cluster.start_agent(DISK_NODE, ports=cluster.port_range(5), gpus=1, gpu_type=DISK_GPU_TYPE,
                        env={"OUTPUT_MAX_MB_PER_TASK": "1", "LOG_MAX_ROWS_PER_JOB": str(JOB_ROWS)})
    yield DISK_NODE
    cluster.agent(DISK_NODE).stop()


def _on_disk_node(name: str, command: str, **top) -> dict:
    return config(name, role(command=command, gpus=1), gpuType=DISK_GPU_TYPE, **top)


def test_a_real_jobs_output_past_the_limit_stores_what_fits_and_its_log_says_why(disk_node, alice, alice_client, bob):
    # Five 400 KB files against OUTPUT_MAX_MB_PER_TASK=1: two fit.
    write = "mkdir -p /pai/output && for i in 1 2 3 4 5; do head -c 409600 /dev/zero > /pai/output/f$i; done"
    target = f"file:///Output/{alice.username}/overlimit"
    job = wait_state(services.job_submit(owner=alice, config=json.dumps(_on_disk_node("overlimit", write, outputDir=target)),
                                         upload_outputs=True), State.SUCCEEDED, timeout=90)
    notes = lines(job, Stream.PLATFORM)
    said = [n for n in notes if "/pai/output" in n]
    assert len(said) == 1, notes
    match = re.search(rf"uploaded 2 files of /pai/output \(819200 bytes\) to {target}; the rest was not uploaded: "
                      r"/pai/output/(f\d) \(409600 bytes\) would pass the limit of 1 MB per task "
                      r"\(OUTPUT_MAX_MB_PER_TASK\)$", said[0])
    assert match, said[0]
    stored = storage.backend().list(f"/Output/{alice.username}/overlimit")
    assert sorted(entry.size for entry in stored) == [409600, 409600]
    assert match.group(1) not in {entry.path.rsplit("/", 1)[-1] for entry in stored}  # the file named as left out is not there

    # The job page's platform log shows it to its owner, to nobody else.
    attempt = TaskAttempt.objects.get(job=job)
    log_url = f"/jobs/{job.pk}/logs/{attempt.pk}/platform/"
    shown = alice_client.get(log_url)
    assert shown.status_code == 200 and "would pass the limit of 1 MB per task (OUTPUT_MAX_MB_PER_TASK)" in shown.content.decode()
    stranger = Client()
    stranger.force_login(bob)
    assert stranger.get(log_url).status_code == 404
    assert "/login/" in Client().get(log_url)["Location"]


def test_a_retried_tasks_second_attempt_stops_at_the_jobs_log_limit_counting_the_first(disk_node, alice):
    # 60 lines per attempt: the first attempt's fit in 100 rows, the second's do not.
    job = services.job_submit(owner=alice, config=json.dumps(_on_disk_node(
        "retriedlog", 'for i in $(seq 1 60); do echo "attempt $PAI_JOB_ATTEMPT line $i"; done; exit 1', retryCount=1)))
    job = wait_state(job, State.FAILED, timeout=120)
    assert JobAttempt.objects.filter(job=job).count() == 2
    first, second = lines(job, number=1), lines(job, number=2)
    assert first == [f"attempt 1 line {i}" for i in range(1, 61)]  # kept whole
    marker = (f"[log truncated: this job passed its limit of {JOB_ROWS} lines or 200 MB over all its tasks and "
              "attempts (LOG_MAX_ROWS_PER_JOB, LOG_MAX_BYTES_PER_JOB); later output is not stored. "
              "The task keeps running.]")
    assert second[-1] == marker, second[-3:]
    kept = second[:-1]
    assert kept == [f"attempt 2 line {i}" for i in range(1, len(kept) + 1)]
    # Every row counts, the first attempt's and platform notes too: the
    # second attempt kept what the limit left after them, no more.
    first_notes, second_notes = (len(lines(job, Stream.PLATFORM, number=n)) for n in (1, 2))
    room = JOB_ROWS - len(first) - first_notes
    assert room - second_notes <= len(kept) <= room < 60, (first_notes, second_notes, len(kept))


# ------------------------------------------------------- logs, per job

@pytest.fixture
def two_tasks(alice) -> tuple[TaskAttempt, TaskAttempt]:
    """Two task attempts of one job, as rows only (no container)."""
    cfg = config("loglimit", role(tasks=2))
    stored = parse_job_value(cfg, user_name=alice.username, default_fs_uri=django_settings.PAI_DEFAULT_FS_URI).normalized
    job = Job.objects.create(owner=alice, name=f"loglimit{alice.pk}", config_raw=json.dumps(cfg), config=stored,
                             virtual_cluster=VirtualCluster.objects.get(name="default"), state=State.SUCCEEDED,
                             total_tasks=2, total_roles=1)
    job_attempt = JobAttempt.objects.create(job=job, number=1, state=State.SUCCEEDED)
    return tuple(  # type: ignore[return-value]
        TaskAttempt.objects.create(task=Task.objects.create(job=job, role="main", index=i), job_attempt=job_attempt,
                                   job=job, number=1, node_name="node-x", state=TaskState.SUCCEEDED)
        for i in range(2))


def _texts(attempt: TaskAttempt, stream: int = Stream.STDOUT) -> list[str]:
    return list(LogLine.objects.filter(attempt=attempt, stream=stream).order_by("seq").values_list("text", flat=True))


def _writer(**limits: int) -> LogWriter:
    writer = LogWriter(flush_seconds=0.05, **limits)
    writer.start()
    return writer


def test_it_stops_a_jobs_logs_at_its_row_limit_over_all_tasks_and_streams(two_tasks):
    first, second = two_tasks
    writer = _writer(max_job_rows=5)
    try:
        for attempt in two_tasks:
            for stream in (Stream.STDOUT, Stream.STDERR):
                writer.open(attempt.pk, stream)
        writer.add(first.pk, Stream.STDOUT, ["", "", ""], (1, 1))  # empty lines: one row each
        writer.add(second.pk, Stream.STDERR, ["", ""], (1, 1))
        assert writer.barrier()
        writer.add(second.pk, Stream.STDOUT, ["one too many"], (2, 1))
        writer.add(first.pk, Stream.STDOUT, ["also"], (2, 1))
        writer.note(second.pk, "platform notes are still written")
        assert writer.barrier()
    finally:
        writer.stop()
    marker = ("[log truncated: this job passed its limit of 5 lines or 200 MB over all its tasks and attempts "
              "(LOG_MAX_ROWS_PER_JOB, LOG_MAX_BYTES_PER_JOB); later output is not stored. The task keeps running.]")
    assert _texts(first) == ["", "", "", marker]
    assert _texts(second, Stream.STDERR) == ["", ""]
    assert _texts(second) == [marker]
    assert _texts(second, Stream.PLATFORM)[0].endswith("platform notes are still written")


def test_it_stops_a_jobs_logs_at_its_byte_limit_across_attempts(two_tasks):
    first, second = two_tasks
    writer = _writer(max_job_bytes=100)
    try:
        writer.open(first.pk, Stream.STDOUT)
        writer.add(first.pk, Stream.STDOUT, ["x" * 59, "y" * 29], (1, 1))  # 60 + 30 bytes with newlines
        assert writer.barrier()
        writer.forget(first.pk)
        # Another writer (another node, or the agent after a restart) counts the same totals.
        other = _writer(max_job_bytes=100)
        try:
            other.open(second.pk, Stream.STDOUT)
            other.add(second.pk, Stream.STDOUT, ["z" * 9, "past the limit"], (1, 1))
            assert other.barrier()
        finally:
            other.stop()
    finally:
        writer.stop()
    assert _texts(first) == ["x" * 59, "y" * 29]
    assert _texts(second)[0] == "z" * 9
    assert _texts(second)[1].startswith("[log truncated: this job passed its limit of 2000000 lines or 100 bytes")
    assert len(_texts(second)) == 2
