"""Submit Job in Debian's Chromium, against the live test portal and nodes:
the form, every reference example pasted into the JSON box, an error shown at
its line, import and export, Clone, a narrow screen, and the page without
JavaScript."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from jobs import jsonc, services, storage
from jobs.models import ACTIVE_TASK_STATES, Job, LogLine, State, Stream, TaskAttempt, TaskState
from tests.browser import SCREENSHOTS, login, screenshot
from tests.cluster import wait_for
from tests.helpers import BUSYBOX_IMAGE, DEBIAN_IMAGE, EXAMPLES, config, describe, lines, role, submit, wait_state

pytestmark = [pytest.mark.services, pytest.mark.browser]

LIST_URL = re.compile(r"^http://[^/]+/(\?.*)?$")


def field(page, path: str):
    """A form field by its config path, e.g. taskRoles[0].memoryMB."""
    return page.locator(f'[data-path="{path}"]')


def field_error(page, path: str):
    return page.locator("#f-" + re.sub(r"[^A-Za-z0-9]+", "-", path) + "-err")


def open_submit(page, user, query: str = "") -> None:
    login(page, user)
    page.goto("/submit/" + query)
    expect(page.locator("#submit-page.js")).to_be_visible()


def shot(page, name: str) -> None:
    """A full-page screenshot from the top (sticky parts where a reader sees
    them); with the JSON box open, what the reader sees."""
    if page.locator("#json-dialog[open]").count():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
        return
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, name)


def job_row(page, name: str):
    return page.locator("tr", has_text=name)


# ------------------------------------------------------------------ the form


def test_it_submits_a_job_through_the_form(page, alice, cluster):
    # Hold every V100 so the new job has to wait, and the list shows it waiting.
    blocker = submit(alice, config("blocker", role(command="sleep 120", gpus=4), gpuType="V100"))
    wait_state(blocker, State.RUNNING)
    open_submit(page, alice)
    shot(page, "submit-form-new")

    name = field(page, "jobName").input_value()
    assert name.startswith("job_")
    field(page, "image").fill(BUSYBOX_IMAGE)
    page.get_by_label("GPU type").select_option("V100")
    field(page, "taskRoles[0].gpuNumber").fill("1")
    field(page, "taskRoles[0].command").fill('echo "greeting=$GREETING"\necho second line')

    # A wrong value shows next to its field as soon as the server has looked.
    field(page, "taskRoles[0].memoryMB").fill("50")
    expect(field_error(page, "taskRoles[0].memoryMB")).to_contain_text("at least 100")
    expect(field(page, "taskRoles[0].memoryMB")).to_have_attribute("aria-invalid", "true")
    field(page, "taskRoles[0].memoryMB").fill("256")
    expect(field_error(page, "taskRoles[0].memoryMB")).to_be_hidden()

    # Task roles can be duplicated, added and removed.
    page.get_by_role("button", name="Duplicate task role 1").click()
    expect(field(page, "taskRoles[1].name")).to_have_value("main2")
    expect(field(page, "taskRoles[1].command")).to_have_value('echo "greeting=$GREETING"\necho second line')
    page.get_by_role("button", name="+ Add task role").click()
    expect(field(page, "taskRoles[2].name")).to_be_focused()
    page.get_by_role("button", name="Remove task role 3").click()
    page.get_by_role("button", name="Remove task role 2").click()
    expect(page.locator("[data-role]")).to_have_count(1)

    # A port row and an environment variable.
    page.get_by_role("button", name="+ Add port").click()
    field(page, "taskRoles[0].portList[0].label").fill("http")
    page.get_by_role("button", name="+ Add variable").click()
    page.locator("[data-env-name]").fill("GREETING")
    page.locator("[data-env-value]").fill("hello")

    # The panel knows the V100s are taken: the job fits, but not now.
    expect(page.get_by_test_id("verdict")).to_have_attribute("data-verdict", "wait")
    expect(page.get_by_test_id("job-needs")).to_contain_text("1 GPU (V100)")
    expect(page.locator("#form-status")).to_have_text("Ready to submit.")
    shot(page, "submit-form-filled")

    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(LIST_URL)
    expect(page.locator(".messages")).to_contain_text(name)
    expect(job_row(page, name)).to_contain_text(re.compile("waiting", re.I))
    shot(page, "submit-redirected-to-list")

    job = Job.objects.get(owner=alice, name=name)
    assert job.config["jobEnvs"] == {"GREETING": "hello"}
    assert job.config["taskRoles"][0]["portList"] == [{"label": "http", "beginAt": 0, "portNumber": 1}]
    services.job_stop(job=blocker, by=alice)
    wait_state(job, State.SUCCEEDED)
    assert lines(job) == ["greeting=hello", "second line"]


# ------------------------------------------------------- the reference examples


def _commands(text: str, replacement: str) -> str:
    """Every "command" of a reference example swapped for a local one."""
    return re.sub(r'"command": "(?:[^"\\]|\\.)*"', lambda _: f'"command": {json.dumps(replacement)}', text)


def _tensorflow(text: str, user) -> str:
    # The code folder must exist; the commands would pip-install from the internet.
    for folder in ("tensorflow-distributed-jobguid/code", "early/code"):
        storage.backend().mkdir(f"/{user.username}/{folder}")
    text = text.replace("your_docker_registry/pai.run.tensorflow", BUSYBOX_IMAGE)
    text = text.replace("your_virtual_cluster", "default").replace("$PAI_DEFAULT_FS_URI/path/", "$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/")
    text = re.sub(r"hdfs://path/to/(\w+)", r"$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/early/\1", text)
    # Two workers of 4 GPUs each are more than the test cluster's 6 GPUs.
    text = text.replace('"gpuNumber": 4', '"gpuNumber": 1')
    return _commands(text, "echo $PAI_TASK_ROLE_NAME $PAI_TASK_ROLE_INDEX batch=$batch_size model=$job_model")


ADAPT = {
    "hello-world-cifar10.json": lambda text, user: _commands(
        text.replace("tensorflow/tensorflow:1.12.0-gpu-py3", BUSYBOX_IMAGE), "echo training cifar10 for 1000 steps"),
    "helloworld-nvidia-smi.json": lambda text, user: _commands(
        text.replace("sitonholy/tensorflow:16.04-9.0-3.5-1.8.0", BUSYBOX_IMAGE), "echo hello world"),
    # Debian's image has Jupyter: the example's own command runs unchanged.
    "jupyter-notebook.json": lambda text, user: text.replace("sitonholy/ai:16.04-9.0-3.5-pmt", DEBIAN_IMAGE),
    "distributed-tensorflow-complete.jsonc": _tensorflow,
    "distributed-tensorflow-early.jsonc": _tensorflow,
}
# What each example's tasks print when their (local) command runs to the
# end, and how many tasks do that before the job succeeds.
RUN_TO_THE_END = {
    "hello-world-cifar10.json": ("training cifar10 for 1000 steps", 1),
    "helloworld-nvidia-smi.json": ("hello world", 1),
    # Both end the job once two tasks completed (minSucceededTaskCount of the
    # workers; killAllOnCompletedTaskNumber) and stop the others.
    "distributed-tensorflow-complete.jsonc": ("{role} {index} batch=32 model=resnet20", 2),
    "distributed-tensorflow-early.jsonc": ("{role} {index} batch= model=", 2),
}


def each_finished_task_printed(job: Job, expected: str) -> int:
    """Every task that succeeded stored its line; one the job's end stopped
    stored it or nothing (it may not have run yet). How many succeeded."""
    wait_for(lambda: not TaskAttempt.objects.filter(job=job, state__in=ACTIVE_TASK_STATES).exists(),
             what="the job's other tasks stopped")
    succeeded = 0
    for attempt in TaskAttempt.objects.filter(job=job).select_related("task"):
        line = expected.format(role=attempt.task.role, index=attempt.task.index)
        printed = list(LogLine.objects.filter(attempt=attempt, stream=Stream.STDOUT).order_by("seq")
                       .values_list("text", flat=True))
        if attempt.state == TaskState.SUCCEEDED:
            assert printed == [line], describe(job)
            succeeded += 1
        else:
            assert attempt.state == TaskState.STOPPED and printed in ([], [line]), describe(job)
    return succeeded


@pytest.mark.parametrize("example", sorted(ADAPT), ids=lambda name: name.split(".")[0])
def test_it_accepts_each_reference_example_pasted_into_the_json_box(page, alice, cluster, example):
    text = ADAPT[example]((EXAMPLES / example).read_text(), alice)
    name = jsonc.loads(text).value["jobName"]
    open_submit(page, alice)
    page.get_by_role("button", name="{ } JSON").click()
    page.locator("#json-box").fill(text)
    page.get_by_role("button", name="Submit this JSON").click()
    expect(page).to_have_url(LIST_URL)
    expect(job_row(page, name)).to_be_visible()

    job = Job.objects.get(owner=alice, name=name)
    assert job.config_raw == text  # comments included
    if example.endswith(".jsonc"):
        assert "// use 2 ps servers in this job" in job.config_raw
    if "tmp" in jsonc.loads(text).value:  # fields the form does not show are kept
        assert job.config["tmp"]["vgInfo"]["名称"] == "test"
    if example in RUN_TO_THE_END:
        wait_state(job, State.SUCCEEDED)
        expected, enough = RUN_TO_THE_END[example]
        assert each_finished_task_printed(job, expected) >= enough
    else:  # Jupyter serves until stopped
        wait_state(job, State.RUNNING)
        services.job_stop(job=job, by=alice)


# ------------------------------------------------------------- the JSON box


def test_it_points_at_the_line_of_a_mistake_in_the_json_box(page, alice, cluster):
    text = (EXAMPLES / "helloworld-nvidia-smi.json").read_text().replace('"memoryMB": 8192', '"memoryMB": 50')
    broken = text.replace('"outputDir": "",', '"outputDir": ""')  # a missing comma ends line 6
    open_submit(page, alice)
    page.get_by_role("button", name="{ } JSON").click()
    page.locator("#json-box").fill(broken)
    page.get_by_role("button", name="Load into form").click()
    expect(page.locator("#json-problems")).to_contain_text("Line 7, column 3")
    expect(page.locator('#json-gutter [data-line="7"]')).to_have_class("bad")
    expect(page.locator("#json-dialog")).to_be_visible()
    shot(page, "submit-json-syntax-error")

    # Valid JSON with a wrong value loads; the problem shows at its line and field.
    page.locator("#json-box").fill(text)
    expect(page.locator("#json-problems")).to_contain_text("Line 14, column 19")
    expect(page.locator('#json-gutter [data-line="14"]')).to_have_class("bad")
    page.get_by_role("button", name="Load into form").click()
    expect(page.locator("#json-dialog")).to_be_hidden()
    expect(field_error(page, "taskRoles[0].memoryMB")).to_contain_text("Expected at least 100 MB, got 50")
    expect(page.locator("#problem-summary")).to_contain_text("Memory per task (MB)")
    shot(page, "submit-field-error")

    # The text is still what was pasted, and submitting it is refused in place.
    page.get_by_role("button", name="{ } JSON").click()
    expect(page.locator("#json-box")).to_have_value(text)
    page.get_by_role("button", name="Submit this JSON").click()
    expect(page.locator("#json-problems")).to_contain_text("Line 14, column 19")
    assert not Job.objects.filter(owner=alice).exists()


def test_it_imports_and_exports_a_file(page, alice, cluster, tmp_path: Path):
    source = (EXAMPLES / "distributed-tensorflow-early.jsonc").read_text()
    source = source.replace("your_docker_registry/pai.run.tensorflow", BUSYBOX_IMAGE)
    source = re.sub(r'"(dataDir|outputDir|codeDir)": "hdfs://[^"]*",\n', "", source)
    upload = tmp_path / "early.jsonc"
    upload.write_text(source)
    open_submit(page, alice)
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import file").click()
    chooser.value.set_files(upload)
    expect(field(page, "jobName")).to_have_value("tensorflow-distributed-example")
    expect(field(page, "taskRoles[1].name")).to_have_value("worker")
    expect(page.locator("#other-keys")).to_contain_text("killAllOnCompletedTaskNumber")

    # Untouched, the export is the file as imported, comments and all.
    with page.expect_download() as download:
        page.get_by_role("button", name="Export", exact=True).click()
    assert download.value.suggested_filename == "tensorflow-distributed-example.json"
    assert Path(download.value.path()).read_text() == source

    # Edited in the form, it is the same config with just that change.
    field(page, "jobName").fill("renamed")
    field(page, "taskRoles[0].taskNumber").fill("3")
    with page.expect_download() as download:
        page.get_by_role("button", name="Export", exact=True).click()
    assert download.value.suggested_filename == "renamed.json"
    expected = jsonc.loads(source).value
    expected["jobName"] = "renamed"
    expected["taskRoles"][0]["taskNumber"] = 3
    assert json.loads(Path(download.value.path()).read_text()) == expected


def test_it_refuses_to_import_a_file_that_is_not_utf8_text(page, alice, cluster, tmp_path: Path):
    # FileReader.readAsText turned bytes that are not UTF-8 into U+FFFD
    # without a word, so a Latin-1 file came in quietly changed; the API
    # refuses such a file ("not UTF-8 text"), and so does the page now.
    upload = tmp_path / "latin1.json"
    upload.write_bytes(json.dumps(config("cafe", role(), description="caf\u00e9"), ensure_ascii=False).encode("latin-1"))
    assert b"caf\xe9" in upload.read_bytes()  # a Latin-1 byte, not UTF-8
    open_submit(page, alice)
    before = field(page, "jobName").input_value()
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import file").click()
    chooser.value.set_files(upload)
    expect(page.locator("#json-problems")).to_contain_text("latin1.json is not UTF-8 text")
    assert "\ufffd" not in page.locator("#json-box").input_value()
    page.keyboard.press("Escape")
    expect(field(page, "jobName")).to_have_value(before)


# -------------------------------------------------------------------- clone


def test_it_clones_a_job_with_its_comments_and_a_new_name(page, alice, cluster):
    text = ('{\n  // the baseline run\n  "jobName": "baseline",\n  "image": "%s",\n'
            '  "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0,\n'
            '                 "command": "echo cloned"}],\n  "extras": {"note": "kept"}\n}') % BUSYBOX_IMAGE
    original = submit(alice, text)
    login(page, alice)
    page.goto(f"/jobs/{original.pk}/")
    page.get_by_role("link", name="Clone", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/submit/\?clone={original.pk}$"))
    expect(field(page, "jobName")).to_have_value("baseline_2")
    expect(field(page, "taskRoles[0].command")).to_have_value("echo cloned")
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(LIST_URL)
    clone = Job.objects.get(owner=alice, name="baseline_2")
    assert clone.config_raw == text.replace('"baseline"', '"baseline_2"')
    assert clone.config["extras"] == {"note": "kept"}


# ------------------------------------------------------- looks, access, no JS


def test_it_works_on_a_narrow_screen_and_labels_every_input(page, alice, cluster):
    page.set_viewport_size({"width": 390, "height": 844})
    open_submit(page, alice)
    page.get_by_role("button", name="+ Add port").click()
    page.get_by_role("button", name="+ Add variable").click()
    shot(page, "submit-narrow")
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    unlabelled = page.evaluate("""() => Array.from(document.querySelectorAll('#submit-page input, #submit-page select, #submit-page textarea'))
        .filter(el => el.type !== 'hidden' && el.type !== 'file' && el.offsetParent !== null)
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
        .map(el => el.outerHTML)""")
    assert unlabelled == []
    # The keyboard reaches the JSON box and Escape closes it.
    page.get_by_role("button", name="{ } JSON").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#json-box")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#json-dialog")).to_be_hidden()


def test_it_submits_without_javascript(browser, alice, cluster):
    context = browser.new_context(base_url=cluster.base_url, java_script_enabled=False)
    try:
        page = context.new_page()
        login(page, alice)
        page.goto("/submit/")
        box = page.locator("#id_config")
        expect(box).to_be_visible()
        box.fill(json.dumps(config("nojs", role(memory=50))))
        page.get_by_role("button", name="Submit job").click()
        expect(page.locator("#problem-summary")).to_contain_text("at least 100")
        expect(box).to_have_value(json.dumps(config("nojs", role(memory=50))))
        shot(page, "submit-no-javascript")
        box.fill(json.dumps(config("nojs", role(memory=256))))
        page.get_by_role("button", name="Submit job").click()
        expect(page).to_have_url(LIST_URL)
        wait_state(Job.objects.get(owner=alice, name="nojs"), State.SUCCEEDED)
    finally:
        context.close()


# ------------------------------------------------------------- protocol v2


def test_it_runs_a_v2_yaml_config_pasted_into_the_box_and_never_shows_its_secret(page, alice, cluster):
    from tests.conftest import unique
    from tests.test_submit import SECRET, v2_secret_config

    name = unique("v2yaml").replace(".", "_")
    open_submit(page, alice)
    page.get_by_role("button", name="{ } JSON").click()
    page.locator("#json-box").fill(v2_secret_config(name))
    expect(page.get_by_role("button", name="Submit this YAML")).to_be_visible()  # the box knows what it holds
    page.get_by_role("button", name="Submit this YAML").click()
    expect(page).to_have_url(LIST_URL)
    expect(job_row(page, name)).to_be_visible()

    job = Job.objects.get(owner=alice, name=name)
    wait_state(job, State.SUCCEEDED)
    assert lines(job) == ["hello from v2", "the secret arrived"]
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#cfg-submitted pre")).to_contain_text("protocolVersion: 2")
    assert SECRET not in page.content()
    shot(page, "submit-v2-job-page")

    # Its clone shows the masked text and asks for the secret again.
    page.goto(f"/submit/?clone={job.pk}")
    expect(page.locator("#broken-banner")).to_contain_text("uses parameters, secrets")
    assert SECRET not in page.content()


def test_it_edits_a_v2_config_in_the_form_and_keeps_it_yaml(page, alice, cluster):
    from tests.conftest import unique
    from tests.test_submit import SIMPLE_V2

    name = unique("v2form").replace(".", "_")
    open_submit(page, alice)
    page.get_by_role("button", name="{ } JSON").click()
    page.locator("#json-box").fill(SIMPLE_V2.replace("NAME", name))
    page.get_by_role("button", name="Load into form").click()
    expect(field(page, "jobName")).to_have_value(name)
    expect(page.locator("#v2-note")).to_be_visible()
    expect(field(page, "codeDir")).to_be_hidden()  # v2 has no place for it
    expect(field(page, "taskRoles[0].command")).to_have_value("echo one && echo two")
    field(page, "taskRoles[0].memoryMB").fill("50")
    expect(field_error(page, "taskRoles[0].memoryMB")).to_contain_text("at least")
    field(page, "taskRoles[0].memoryMB").fill("300")
    expect(page.locator("#form-status")).to_have_text("Ready to submit.")
    expect(page.locator("#export-other-button")).to_be_enabled()
    shot(page, "submit-v2-in-the-form")
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(LIST_URL)

    job = Job.objects.get(owner=alice, name=name)
    assert "protocolVersion: 2" in job.config_raw and "memoryMB: 300" in job.config_raw
    assert "description: kept as it is" in job.config_raw
    wait_state(job, State.SUCCEEDED)
    assert lines(job) == ["one", "two"]
