"""Image pulls on the job page (jobs/services/pulls.py, jobs/node/images/):
while a node pulls a task's image, the page shows which image, layers done of
total, bytes downloaded and the time so far, updated live; a failed pull
keeps its message.

Against a real registry (Debian's docker-registry on loopback, tests/
registry.py) serving an image built here: busybox plus LAYERS layers of
random bytes (which no compression shrinks), pushed, then removed from the
engine so that each test pulls all of it again. The image is large enough
for a loopback pull to last a few seconds; only the page's test slows the
registry down (tests/registry.trickling): the page's first poll may come 2 s
after the pull started."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import docker.errors
import pytest
import requests
from django.db.models import F

from jobs import services
from jobs.models import ExitType, ImagePull, Job, State, TaskAttempt, TaskState
from jobs.node.launcher import PullProgress
from jobs.node.images.records import PullRecord
from jobs.node.launcher.docker import PullTally
from tests.browser import login as browser_login
from tests.browser import screenshot
from tests.cluster import wait_for
from tests.helpers import BUSYBOX_IMAGE, config, lines, login, role, rows_only_attempt, submit, unique, wait_state
from tests.registry import forget, image_in_registry, registry_agent, running_registry, trickling

pytestmark = pytest.mark.services

NODE, GPU_TYPE, GPUS = "t-node-pull", "PULLTEST", 2
LAYERS, LAYER_MB = 8, 100


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[str]:
    with running_registry(tmp_path_factory.mktemp("pull-registry")) as address:
        yield address


@pytest.fixture(scope="module")
def big_image(registry) -> Iterator[str]:
    """<registry>/pull/big:latest, of LAYERS x LAYER_MB MB of random bytes on
    busybox, in the registry only."""
    steps = "".join(f"RUN head -c {LAYER_MB * 1000 * 1000} /dev/urandom > /layer{n}\n" for n in range(LAYERS))
    with image_in_registry(f"{registry}/pull/big:latest", f"FROM {BUSYBOX_IMAGE}\n{steps}") as image:
        yield image


@pytest.fixture(scope="module")
def pull_node(cluster, registry) -> Iterator[str]:
    """With GPUS GPUs: a blocker job can hold them."""
    with registry_agent(cluster, registry, NODE, gpus=GPUS, gpu_type=GPU_TYPE) as name:
        yield name


@pytest.fixture(autouse=True)
def _registry_allowed(settings, registry) -> None:
    settings.REGISTRY_ALLOWED = [registry]  # submission runs in this process


def base_layers() -> int:
    return len(docker.from_env().api.inspect_image(BUSYBOX_IMAGE)["RootFS"]["Layers"])


def pull_job(user, name: str, image: str) -> Job:
    return submit(user, config(name, role(command=f"echo {name} ran", gpus=1), image=image, gpuType=GPU_TYPE))


def launching_attempts(job: Job, count: int) -> list[TaskAttempt]:
    def launching() -> list[TaskAttempt] | None:
        found = list(TaskAttempt.objects.filter(job=job, state=TaskState.LAUNCHING))
        return found if len(found) == count else None

    return wait_for(launching, timeout=60, what=f"job {job.name}'s {count} tasks to launch")


def test_it_adds_up_the_engines_pull_events():
    """The events as Docker 20.10 sent them for an image of two new layers
    on a base of one (seen in this file's pulls)."""
    tally = PullTally()
    events = [
        {"status": "Pulling from pull/big", "id": "latest"},
        {"status": "Already exists", "progressDetail": {}, "id": "base"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "one"},
        {"status": "Waiting", "progressDetail": {}, "id": "two"},
        {"status": "Downloading", "progressDetail": {"current": 400, "total": 1000}, "id": "one"},
    ]
    assert [tally.add(event) for event in events] == [False, True, True, True, True]
    assert tally.progress() == PullProgress(layers_done=1, layers_total=3, bytes_done=400, bytes_total=1000,
                                            sizes_pending=1)
    for event in [
        {"status": "Retrying in 5 seconds", "progressDetail": {}, "id": "two"},
        {"status": "Downloading", "progressDetail": {"current": 100, "total": 3000}, "id": "two"},
        {"status": "Download complete", "progressDetail": {}, "id": "one"},
        {"status": "Extracting", "progressDetail": {"current": 500, "total": 1000}, "id": "one"},
        {"status": "Pull complete", "progressDetail": {}, "id": "one"},
    ]:
        tally.add(event)
    assert tally.progress() == PullProgress(layers_done=2, layers_total=3, bytes_done=1100, bytes_total=4000)
    tally.add({"status": "Pull complete", "progressDetail": {}, "id": "two"})
    assert not tally.add({"status": "Digest: sha256:e4cc"})
    assert tally.progress() == PullProgress(layers_done=3, layers_total=3, bytes_done=4000, bytes_total=4000)


def test_it_writes_no_count_while_the_engine_is_still_naming_the_layers(alice):
    """The engine names the layers it has first, one by one, then those it
    fetches: a count written after the first ("layers 1/1") dropped back on
    the page ("layers 2/10") a moment later (CI 108)."""
    attempt = rows_only_attempt(alice, unique("pull-naming-"))
    ticks = iter(range(0, 100, 1))  # a second between two events: past PROGRESS_INTERVAL each time
    record = PullRecord(attempt.pk, "127.0.0.1:5000/pull/big:latest", clock=lambda: float(next(ticks)))
    record.start()
    record.progress(PullProgress(layers_done=1, layers_total=1))
    record.progress(PullProgress(layers_done=2, layers_total=10, sizes_pending=8))
    pull = ImagePull.objects.get(attempt_id=attempt.pk)
    assert (pull.layers_done, pull.layers_total) == (0, 0)  # as started: the count is not known yet
    record.progress(PullProgress(layers_done=2, layers_total=10, bytes_done=1, bytes_total=300, sizes_pending=7))
    pull.refresh_from_db()
    assert (pull.layers_done, pull.layers_total, pull.bytes_total) == (2, 10, 300)
    record.finish()
    pull.refresh_from_db()
    assert (pull.state, pull.layers_total) == (ImagePull.State.DONE, 10)


def test_it_records_a_pull_as_it_goes(alice, big_image, pull_node):
    """Two tasks of one job wait on the image on one node: the engine pulls
    it once, and each task's row follows it."""
    forget(big_image)
    job = submit(alice, config("pull-rows", role(command="echo pull-rows ran", gpus=1, tasks=GPUS), image=big_image,
                               gpuType=GPU_TYPE))
    attempts = launching_attempts(job, GPUS)
    seen: dict[int, list[tuple[int, int, int, int]]] = {attempt.pk: [] for attempt in attempts}

    def pulls_ended() -> bool:
        pulls = list(ImagePull.objects.filter(attempt__in=attempts))
        for pull in pulls:
            row = (pull.layers_done, pull.layers_total, pull.bytes_done, pull.bytes_total)
            rows = seen[pull.attempt_id]
            if pull.state == ImagePull.State.PULLING and (not rows or rows[-1] != row):
                rows.append(row)
        return len(pulls) == GPUS and all(pull.state != ImagePull.State.PULLING for pull in pulls)

    wait_for(pulls_ended, timeout=120, interval=0.05, what="the pulls to end")
    print(f"pull rows seen (layers done, layers, bytes done, bytes known), by attempt: {seen}")
    total_layers = base_layers() + LAYERS  # the base's layers "Already exists"
    for attempt in attempts:
        pull = ImagePull.objects.get(attempt=attempt)
        assert pull.state == ImagePull.State.DONE, pull.error
        assert pull.image == big_image and pull.node.name == NODE and pull.error == ""
        assert (pull.layers_done, pull.layers_total) == (total_layers, total_layers)
        assert pull.bytes_done == pull.bytes_total >= LAYERS * LAYER_MB * 1000 * 1000
        assert pull.sizes_pending == 0
        assert pull.finished_at >= pull.started_at

        # Seen growing: several sizes while it pulled, never going back.
        rows = seen[attempt.pk]
        downloaded = [row[2] for row in rows]
        assert len(set(downloaded)) >= 2, rows
        assert downloaded == sorted(downloaded), rows
        assert [row[0] for row in rows] == sorted(row[0] for row in rows), rows
        assert any(0 < row[2] < pull.bytes_total for row in rows), rows

    job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=90)
    assert job.state == State.SUCCEEDED, job.exit_reason
    assert [lines(job, index=index) for index in range(GPUS)] == [["pull-rows ran"]] * GPUS


def test_it_shows_the_pull_on_the_job_page_live(alice, registry, big_image, pull_node, page):
    forget(big_image)
    # Hold the node's GPUs so that the page is open before the pull starts.
    blocker = submit(alice, config("blocker", role(command="sleep 600", gpus=GPUS), gpuType=GPU_TYPE))
    wait_state(blocker, State.RUNNING)
    job = pull_job(alice, "pull-page", big_image)
    wait_state(job, State.WAITING)

    browser_login(page, alice)
    page.goto(f"/jobs/{job.pk}/")
    page.evaluate("""() => {
        window.pullTexts = [];
        window.notReloaded = true;
        const note = () => {
            const bytes = document.querySelector('.image-pull .pull-bytes');
            const layers = document.querySelector('.image-pull .pull-layers');
            const text = bytes && layers ? layers.textContent + ' ' + bytes.textContent : null;
            if (text && window.pullTexts[window.pullTexts.length - 1] !== text) window.pullTexts.push(text);
        };
        new MutationObserver(note).observe(document.getElementById('job-live'), {childList: true, subtree: true});
    }""")
    # The registry trickles while the layers download: on loopback they can
    # arrive in full before the page's first poll, which then sees one size.
    with trickling(registry):
        services.job_stop(job=blocker, by=alice)
        section = page.locator(".image-pull")
        section.wait_for(timeout=60_000)
        assert big_image in section.inner_text() and "Pulling image" in section.inner_text()
        assert f"Pulling image {big_image}: 1 task." in page.locator(".status-words").inner_text()
        screenshot(page, "image-pull-live")
        wait_for(lambda: ImagePull.objects.filter(attempt__job=job, bytes_total__gt=0,
                                                  bytes_done=F("bytes_total")).exists(),
                 timeout=120, what="the layers to download")
    job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=120)
    assert job.state == State.SUCCEEDED, job.exit_reason
    page.locator(".image-pull").wait_for(state="detached", timeout=30_000)  # gone once the task ran

    texts = page.evaluate("window.pullTexts")
    assert page.evaluate("window.notReloaded") is True
    print(f"the open page showed: {texts}")
    megabytes = [int(text.split("MB of")[0].split()[-1]) for text in texts]
    assert len(set(megabytes)) >= 2, texts  # the bytes changed on the open page
    assert megabytes == sorted(megabytes), texts
    total_layers = base_layers() + LAYERS
    assert all(f"/{total_layers} " in text for text in texts if not text.startswith("layers 0/0")), texts


def test_it_keeps_a_failed_pulls_message_for_its_owner_only(alice, bob, registry, pull_node, cluster):
    missing = f"{registry}/pull/missing:latest"
    job = pull_job(alice, "pull-missing", missing)
    job = wait_state(job, State.SUCCEEDED, State.FAILED, timeout=90)
    assert job.state == State.FAILED and job.exit_type == ExitType.IMAGE_PULL, job.exit_reason
    pull = ImagePull.objects.get(attempt__job=job)
    assert pull.state == ImagePull.State.FAILED and pull.finished_at is not None
    assert pull.error.startswith(f"could not pull image {missing}: ") and "manifest unknown" in pull.error, pull.error

    owner = login(cluster.base_url, alice)
    for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/live/"):
        shown = owner.get(cluster.base_url + url)
        assert shown.status_code == 200
        assert "Image pull failed" in shown.text and "manifest unknown" in shown.text
        assert 'data-pull-state="FAILED"' in shown.text

        other = login(cluster.base_url, bob).get(cluster.base_url + url, allow_redirects=False)
        assert other.status_code == 404 and "manifest unknown" not in other.text
        anonymous = requests.get(cluster.base_url + url, allow_redirects=False)
        assert anonymous.status_code == 302 and "/login/" in anonymous.headers["Location"]


def test_it_lets_admins_see_a_pull(make_user, alice, registry, pull_node, cluster):
    job = pull_job(alice, "pull-admin", f"{registry}/pull/absent:latest")
    wait_state(job, State.FAILED, timeout=90)
    admin = login(cluster.base_url, make_user("admin", admin=True))
    shown = admin.get(f"{cluster.base_url}/jobs/{job.pk}/live/")
    assert shown.status_code == 200 and "Image pull failed" in shown.text


def test_a_job_stopped_while_its_image_is_pulled_ends_without_waiting_for_the_pull(alice, big_image, pull_node):
    """The launch waited for the whole pull (minutes for a big image, for
    ever on a registry that never answers): the job stayed STOPPING, and
    then its command started before it was stopped."""
    forget(big_image)
    job = pull_job(alice, "pull-stop", big_image)
    wait_for(lambda: ImagePull.objects.filter(attempt__job=job, state=ImagePull.State.PULLING,
                                              bytes_done__gt=0).exists(),
             timeout=60, interval=0.05, what="the pull to be under way")
    services.job_stop(job=job, by=alice)
    job = wait_state(job, State.STOPPED, timeout=30)
    pull = ImagePull.objects.get(attempt__job=job)
    assert pull.state == ImagePull.State.PULLING or pull.finished_at > job.finished_at  # not waited for
    attempt = TaskAttempt.objects.get(job=job)
    assert attempt.state == TaskState.STOPPED and attempt.container_id == ""
    # The pull goes on (another task may want the image) and its record ends.
    wait_for(lambda: ImagePull.objects.get(pk=pull.pk).state != ImagePull.State.PULLING, timeout=120,
             what="the pull's record to end")
    assert lines(job) == []
