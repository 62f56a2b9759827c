"""Jobs on HDFS end to end: a node agent and gunicorn of their own, both with
STORAGE_BACKEND=webhdfs on the session's minicluster (tests/hdfs_cluster.py),
real containers. A job's codeDir is fetched from HDFS as its owner, the
task's /pai/output lands in outputDir on HDFS, owned by them, and downloads
from the job's folder on the storage page; submitted through the service
layer with hdfs:// URIs and through the REST API with $PAI_DEFAULT_FS_URI.

Containers here cannot reach the namenode (it listens on 127.0.0.1 only,
and job networks are isolated), so a task reads the input that came with
its codeDir; dataDir reaches it as PAI_DATA_DIR, a full hdfs:// URI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.test import override_settings

from jobs import services, storage
from jobs.models import State, Stream, TaskAttempt, TaskState
from jobs.spec import SpecError
from tests.cluster import Cluster, wait_for
from tests.helpers import config, lines, login, role, wait_state
from tests.test_api import expect
from tests.test_api import login as api_login

pytestmark = pytest.mark.services

GPU_TYPE = "HDFSNODE"  # only this module's agent has it: its jobs land there and nowhere else

RUN_SH = """echo "words in the input: $(cat input/words.txt | wc -w)"
echo "data is $PAI_DATA_DIR"
wc -w < input/words.txt > /pai/output/count.txt
echo "output goes to $PAI_OUTPUT_DIR" > /pai/output/where.txt
"""


@pytest.fixture(scope="module")
def hdfs_portal(hdfs_cluster, redis_server, docker_engine, static_files) -> Iterator[Cluster]:
    """One node agent and gunicorn, both on HDFS."""
    running = Cluster()
    env = hdfs_cluster.portal_settings()
    try:
        running.start_agent("t-node-hdfs", ports=running.port_range(2), gpus=1, gpu_type=GPU_TYPE, env=env)
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
    project = tmp_path / "proj"
    (project / "input").mkdir(parents=True)
    (project / "run.sh").write_text(RUN_SH)
    (project / "input" / "words.txt").write_text("one two three four five\n")
    owner = storage.reader_for(user_name=user.username, is_admin=False)
    storage.upload_tree(project, f"/{user.username}/proj", reader=owner)


def job_config(name: str, **folders: str) -> dict:
    return config(name, role(command="sh run.sh", gpus=1), gpuType=GPU_TYPE, **folders)


def test_it_runs_a_job_whose_folders_are_on_hdfs_and_serves_its_output(
        hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    fs, home = hdfs_cluster.fs_uri, f"/{alice.username}"
    upload_project(tmp_path, alice)
    cfg = job_config("onhdfs", codeDir=f"{fs}{home}/proj", dataDir=f"{fs}{home}/data",
                     outputDir=f"{fs}/Output/{alice.username}/onhdfs")
    job = wait_state(services.job_submit(owner=alice, config=json.dumps(cfg), upload_outputs=True),
                     State.SUCCEEDED, timeout=120)
    assert lines(job) == ["words in the input: 5", f"data is {fs}{home}/data"]

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

def test_it_says_hdfs_did_not_answer_keeps_what_is_stored_and_works_again_when_it_is_back(
        hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    upload_project(tmp_path, alice)
    fs, home = hdfs_cluster.fs_uri, f"/{alice.username}"
    api = api_login(hdfs_portal.base_url, alice)
    hdfs_cluster.stop()
    try:
        # At submission: refused, saying HDFS did not answer, in the service and the API.
        with pytest.raises(SpecError) as error:
            services.job_submit(owner=alice, config=json.dumps(job_config("down", codeDir=f"{fs}{home}/proj")))
        problems = {p.path: p.message for p in error.value.problems}
        assert problems["codeDir"] == f"HDFS at {hdfs_cluster.url} did not answer (ConnectionError)"
        refused = expect(api.post(f"/user/{alice.username}/jobs", job_config("down", codeDir="proj")), 400,
                         "InvalidParametersError")
        assert "did not answer" in refused["message"]
    finally:
        hdfs_cluster.start()

    # The node's one GPU of this type goes to `running` first; `queued` waits
    # for it, so HDFS stops after `running` fetched its code and before
    # `queued` can: `running` loses its output upload, `queued` its staging.
    slow = job_config("running", codeDir=f"{fs}{home}/proj")
    slow["taskRoles"][0]["command"] = "sleep 4; sh run.sh"
    running = services.job_submit(owner=alice, config=json.dumps(slow), upload_outputs=True)
    queued = services.job_submit(owner=alice, config=json.dumps(job_config("queued", codeDir="proj")),
                                 upload_outputs=True)
    wait_for(lambda: TaskAttempt.objects.filter(job=running, state=TaskState.RUNNING).exists(), timeout=90,
             what="the first job's container to run")
    hdfs_cluster.stop()
    try:
        running = wait_state(running, State.SUCCEEDED, timeout=60)  # the command's own result stands
        notes = lines(running, Stream.PLATFORM)
        said = f"could not upload /pai/output to {fs}/Output/{alice.username}/running: HDFS at {hdfs_cluster.url} " \
               "did not answer (ConnectionError)"
        assert any(note.endswith(said) for note in notes), notes
        queued = wait_state(queued, State.FAILED, timeout=60)
        assert queued.exit_reason.endswith(f"could not fetch codeDir {fs}{home}/proj: HDFS at {hdfs_cluster.url} "
                                           "did not answer (ConnectionError)"), queued.exit_reason
    finally:
        hdfs_cluster.start()

    # Back: what was stored is there, and new jobs run with no restart of the agent or gunicorn.
    assert hdfs_cluster.read(f"{home}/proj/input/words.txt", user=alice.username) == b"one two three four five\n"
    again = wait_state(services.job_submit(owner=alice, config=json.dumps(job_config("backagain", codeDir="proj")),
                                           upload_outputs=True), State.SUCCEEDED, timeout=120)
    assert lines(again)[0] == "words in the input: 5"
    assert hdfs_cluster.read(f"/Output/{alice.username}/backagain/count.txt").strip() == b"5"
