"""The reference documents' HDFS workflow end to end, in Debian's Chromium,
against the real HDFS (the session's minicluster, tests/hdfs_cluster.py):
a user uploads a code folder and a data file on the storage page, submits a
job whose codeDir, dataDir and outputDir are hdfs:// URIs from the Submit
page's JSON box, the task reads its data at /pai/data and writes a result to
/pai/output, and the result is on HDFS in outputDir, owned by the user, and
downloads from the job page. Then the same job with $PAI_DEFAULT_FS_URI, and
the same job through the REST API.

A node agent and gunicorn of this module's own run with STORAGE_BACKEND=
webhdfs; the page fixture points Chromium at that gunicorn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from jobs.models import Job, State
from tests.browser import login, screenshot
from tests.cluster import Cluster
from tests.helpers import config, lines, role, wait_state
from tests.helpers import login as web_login
from tests.test_api import expect as expect_json
from tests.test_api import login as api_login

pytestmark = [pytest.mark.services, pytest.mark.browser]

GPU_TYPE = "HDFSBROWSER"  # only this module's agent has it

TRAIN_SH = """echo "training on $(wc -l < /pai/data/samples.csv) samples from $PAI_DATA_DIR"
awk -F, '{ total += $2 } END { print "sum=" total }' /pai/data/samples.csv > /pai/output/model.txt
echo "lib says: $(cat lib/version.txt)" >> /pai/output/model.txt
"""
SAMPLES = "a,1\nb,2\nc,39\n"
MODEL = "sum=42\nlib says: v1\n"


@pytest.fixture(scope="module")
def hdfs_portal(hdfs_cluster, redis_server, docker_engine, static_files) -> Iterator[Cluster]:
    running = Cluster()
    env = hdfs_cluster.portal_settings()
    try:
        running.start_agent("t-node-hdfs-browser", ports=running.port_range(4), gpus=1, gpu_type=GPU_TYPE, env=env)
        running.start_portal(name="gunicorn-hdfs-browser", env=env)
        yield running
    finally:
        running.stop_all()


@pytest.fixture
def page(browser, hdfs_portal) -> Iterator[object]:
    context = browser.new_context(base_url=hdfs_portal.base_url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def job_config(name: str, *, code: str, data: str, output: str) -> dict:
    return config(name, role(command="sh train.sh", gpus=1), gpuType=GPU_TYPE, codeDir=code, dataDir=data,
                  outputDir=output, extras={"uploadOutputs": True})


def submit_json(page, text: str) -> None:
    page.goto("/submit/")
    page.get_by_role("button", name="{ } JSON").click()
    page.locator("#json-box").fill(text)
    page.get_by_role("button", name="Submit this JSON").click()
    expect(page).to_have_url(re.compile(r"^http://[^/]+/(\?.*)?$"))  # the job list


def download_from_job_page(page, job: Job, output_uri: str) -> str:
    """Job page -> its outputDir on the storage page -> model.txt."""
    page.goto(f"/jobs/{job.pk}/")
    page.locator('[data-storage-link="outputDir"]').click()
    expect(page.locator("#folder-uri")).to_have_text(output_uri)
    with page.expect_download() as download:
        page.get_by_role("link", name="model.txt").first.click()
    return Path(download.value.path()).read_text()


def test_it_runs_the_hdfs_workflow_from_the_storage_page_to_the_job_page(
        page, hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    fs, user = hdfs_cluster.fs_uri, alice.username
    project = tmp_path / "mnist"
    (project / "lib").mkdir(parents=True)
    (project / "train.sh").write_text(TRAIN_SH)
    (project / "lib" / "version.txt").write_text("v1\n")
    samples = tmp_path / "samples.csv"
    samples.write_text(SAMPLES)

    # The storage page opens at the user's home on HDFS.
    login(page, alice)
    page.goto("/storage/")
    expect(page.locator("#folder-uri")).to_have_text(f"{fs}/{user}")
    page.locator("#upload-folder").set_input_files(project)
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("link", name="mnist/")).to_be_visible()  # the page reloads when done
    page.locator("#new-folder").fill("data")
    page.get_by_role("button", name="Create").click()
    page.get_by_role("link", name="data/").click()
    expect(page.locator("#folder-uri")).to_have_text(f"{fs}/{user}/data")
    page.locator("#upload-files").set_input_files(samples)
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("link", name="samples.csv")).to_be_visible()
    screenshot(page, "hdfs-storage-data")
    # On HDFS itself, written as alice (doas), not as the portal's service user.
    assert hdfs_cluster.read(f"/{user}/data/samples.csv", user=user).decode() == SAMPLES
    assert hdfs_cluster.status(f"/{user}/mnist/lib/version.txt")["owner"] == user
    assert hdfs_cluster.status(f"/{user}/data/samples.csv")["owner"] == user

    # hdfs:// URIs, pasted into the Submit page's JSON box.
    output = f"{fs}/Output/{user}/mnist-uri"
    submit_json(page, json.dumps(job_config("mnist-uri", code=f"{fs}/{user}/mnist", data=f"{fs}/{user}/data",
                                            output=output)))
    job = wait_state(Job.objects.get(owner=alice, name="mnist-uri"), State.SUCCEEDED, timeout=120)
    assert lines(job) == [f"training on 3 samples from {fs}/{user}/data"]
    assert hdfs_cluster.read(f"/Output/{user}/mnist-uri/model.txt", user=user).decode() == MODEL
    assert hdfs_cluster.status(f"/Output/{user}/mnist-uri/model.txt")["owner"] == user
    assert download_from_job_page(page, job, output) == MODEL
    screenshot(page, "hdfs-job-output")

    # The same job written with $PAI_DEFAULT_FS_URI, as the reference examples write it.
    submit_json(page, json.dumps(job_config(
        "mnist-fs", code="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/mnist", data="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/data",
        output="$PAI_DEFAULT_FS_URI/Output/$PAI_USER_NAME/mnist-fs")))
    job = wait_state(Job.objects.get(owner=alice, name="mnist-fs"), State.SUCCEEDED, timeout=120)
    assert job.config["dataDir"] == f"{fs}/{user}/data"
    assert lines(job) == [f"training on 3 samples from {fs}/{user}/data"]
    assert download_from_job_page(page, job, f"{fs}/Output/{user}/mnist-fs") == MODEL


def test_it_runs_the_same_job_through_the_rest_api(hdfs_portal, hdfs_cluster, alice, tmp_path: Path) -> None:
    fs, user = hdfs_cluster.fs_uri, alice.username
    # The files go in through the storage page's upload endpoint, as its script sends them.
    web = web_login(hdfs_portal.base_url, alice)
    web.get(f"{hdfs_portal.base_url}/storage/", timeout=30)  # makes the home
    files = [("files", ("train.sh", TRAIN_SH.encode())), ("files", ("version.txt", b"v1\n")),
             ("files", ("samples.csv", SAMPLES.encode()))]
    saved = web.post(f"{hdfs_portal.base_url}/storage/upload/", files=files,
                     data={"path": f"/{user}", "names": ["mnist/train.sh", "mnist/lib/version.txt", "data/samples.csv"]},
                     headers={"Accept": "application/json", "X-CSRFToken": web.cookies["csrftoken"],
                              "Referer": f"{hdfs_portal.base_url}/storage/"}, timeout=60)
    assert saved.status_code == 200, saved.text

    api = api_login(hdfs_portal.base_url, alice)
    cfg = job_config("mnist-api", code="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/mnist", data=f"{fs}/{user}/data",
                     output=f"{fs}/Output/{user}/mnist-api")
    expect_json(api.post(f"/user/{user}/jobs", cfg), 202)
    job = wait_state(Job.objects.get(owner=alice, name="mnist-api"), State.SUCCEEDED, timeout=120)
    assert lines(job) == [f"training on 3 samples from {fs}/{user}/data"]
    assert hdfs_cluster.read(f"/Output/{user}/mnist-api/model.txt").decode() == MODEL
    download = web.get(f"{hdfs_portal.base_url}/storage/download/", params={"path": f"{fs}/Output/{user}/mnist-api/model.txt"},
                       timeout=30)
    assert download.status_code == 200 and download.text == MODEL
