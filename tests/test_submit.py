"""Submit Job, server side: the page, the validate endpoint the page calls as
the user types, a rejected submit that keeps the text, Clone and prefill.
The browser side is in tests/test_submit_browser.py."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from jobs.models import Job, State, VirtualCluster
from tests.conftest import unique
from tests.helpers import BUSYBOX_IMAGE, config, hold_vc, role, submit

SUBMIT = reverse("jobs:submit")
VALIDATE = reverse("jobs:submit_validate")

# A config as people paste it: comments, and three mistakes on known lines.
COMMENTED_BAD = """{
  // my experiment
  "jobName": "NAME",
  "image": "%s",
  "taskRoles": [
    {
      "name": "main", "taskNumber": 1, "cpuNumber": 1, "gpuNumber": 0,
      "memoryMB": 50, /* far too little */
      "command": "echo hi",
      "memroyMB": 512
    }
  ],
  "retryCount": -1
}""" % BUSYBOX_IMAGE


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def initial_of(response) -> dict:
    """The JSON the page hands its script: text, decoded config, problems."""
    return response.context["initial"]


def validate(client: Client, text: str) -> dict:
    response = client.post(VALIDATE, {"config": text})
    assert response.status_code == 200
    return response.json()


# ----------------------------------------------------------------- the page


def test_it_opens_with_a_config_that_runs_as_is(alice):
    response = client_for(alice).get(SUBMIT)
    assert response.status_code == 200
    initial = initial_of(response)
    cfg = initial["value"]
    assert re.fullmatch(r"job_\d{8}_\d{6}", cfg["jobName"])
    assert cfg["taskRoles"][0]["command"]
    assert initial["problems"] == [] and initial["syntaxOk"] is True
    # Without JavaScript the same config is in the textarea that is posted.
    assert html.escape(cfg["jobName"]) in response.content.decode()
    assert 'name="config"' in response.content.decode()


def test_it_offers_only_the_virtual_clusters_the_user_may_use(alice, bob):
    mine = VirtualCluster.objects.create(name=unique("mine"), capacity=0)
    mine.users.add(alice)
    theirs = VirtualCluster.objects.create(name=unique("theirs"), capacity=0)
    theirs.users.add(bob)
    names = [vc.name for vc in client_for(alice).get(SUBMIT).context["vcs"]]
    assert mine.name in names and VirtualCluster.DEFAULT in names
    assert theirs.name not in names


def test_it_prefills_folders_from_the_query(alice):
    response = client_for(alice).get(SUBMIT, {"codeDir": f"/{alice.username}/code", "outputDir": f"/{alice.username}/out"})
    cfg = initial_of(response)["value"]
    assert cfg["codeDir"] == f"/{alice.username}/code"
    assert cfg["outputDir"] == f"/{alice.username}/out"
    assert "dataDir" not in cfg
    # The code folder does not exist yet: said at once, next to the field.
    assert [p["path"] for p in initial_of(response)["problems"]] == ["codeDir"]


# ------------------------------------------------------------ validation


def test_it_validates_every_problem_at_once_with_lines_and_keeps_nothing(alice):
    before = Job.objects.count()
    result = validate(client_for(alice), COMMENTED_BAD.replace("NAME", unique("v")))
    problems = {p["path"]: p for p in result["problems"]}
    assert set(problems) == {"taskRoles[0].memoryMB", "retryCount"}
    assert (problems["taskRoles[0].memoryMB"]["line"], problems["taskRoles[0].memoryMB"]["column"]) == (8, 19)
    assert "at least 100" in problems["taskRoles[0].memoryMB"]["message"]
    assert problems["retryCount"]["line"] == 13
    # The misspelt key is a warning (kept, not used), with a hint.
    assert [w["path"] for w in result["warnings"]] == ["taskRoles[0].memroyMB"]
    assert "memoryMB" in result["warnings"][0]["message"]
    # The decoded config comes back whole, for the form to show.
    assert result["syntaxOk"] is True and result["value"]["taskRoles"][0]["memroyMB"] == 512
    assert Job.objects.count() == before


def test_it_reports_a_syntax_error_at_its_line_and_column(alice):
    text = '{\n  "jobName": "x",\n  "image": "busybox"\n  "taskRoles": []\n}'
    result = validate(client_for(alice), text)
    assert result["syntaxOk"] is False and result["value"] is None
    [problem] = result["problems"]
    assert (problem["line"], problem["column"]) == (4, 3)  # where the comma is missing
    assert "expected \",\" or \"}\"" in problem["message"]


def test_it_names_a_taken_job_name_and_a_free_one(alice):
    job = submit(alice, config(unique("taken"), role()))
    result = validate(client_for(alice), json.dumps(config(job.name, role())))
    [problem] = result["problems"]
    assert problem["path"] == "jobName" and problem["line"] == 1
    assert f'"{job.name}_2" is free' in problem["message"]


def test_it_refuses_a_virtual_cluster_the_user_may_not_use_at_its_line(alice, bob):
    private = VirtualCluster.objects.create(name=unique("private"), capacity=0)
    private.users.add(bob)
    text = json.dumps(config(unique("j"), role(), virtualCluster=private.name), indent=2)
    result = validate(client_for(alice), text)
    [problem] = result["problems"]
    assert problem["path"] == "virtualCluster"
    assert "may not submit" in problem["message"]
    assert text.splitlines()[problem["line"] - 1].strip().startswith('"virtualCluster"')


def test_it_says_whether_the_job_could_ever_fit(alice, cluster):
    client = client_for(alice)
    fits = validate(client, json.dumps(config(unique("fit"), role(gpus=1), gpuType="V100")))
    assert fits["verdict"] == "now"
    assert "V100" in fits["panel"] and "Running jobs" in fits["panel"]
    # Node a has 4 V100s: 5 in one task can never fit, whatever else finishes.
    never = validate(client, json.dumps(config(unique("big"), role(gpus=5), gpuType="V100")))
    assert never["problems"] == [] and never["verdict"] == "never"
    assert "Can never fit" in never["panel"]


def test_it_needs_a_login():
    response = Client().post(VALIDATE, {"config": "{}"})
    assert response.status_code == 302 and "/login/" in response["Location"]


# ---------------------------------------------------------------- submit


def test_it_queues_a_pasted_config_with_its_comments(alice):
    name = unique("pasted")
    # Into a virtual cluster with no share: the session's cluster, started by
    # an earlier test, could otherwise start the job before it is read here.
    held = hold_vc(unique("held"), alice)
    text = (COMMENTED_BAD.replace("NAME", name).replace('"memoryMB": 50', '"memoryMB": 256')
            .replace('"retryCount": -1', f'"retryCount": 0, "virtualCluster": "{held.name}"'))
    response = client_for(alice).post(SUBMIT, {"config": text, "mode": "json"})
    assert response.status_code == 302 and response["Location"] == reverse("jobs:list")
    job = Job.objects.get(owner=alice, name=name)
    assert job.state == State.WAITING
    assert job.config_raw == text and "// my experiment" in job.config_raw
    # The unknown key is kept in the stored config.
    assert job.config["taskRoles"][0]["memroyMB"] == 512


def test_it_keeps_the_text_and_shows_every_problem_when_a_submit_is_rejected(alice):
    text = COMMENTED_BAD.replace("NAME", unique("bad"))
    response = client_for(alice).post(SUBMIT, {"config": text, "mode": "json"})
    assert response.status_code == 200
    page = response.content.decode()
    assert html.escape(text) in page  # in the textarea, to the byte
    assert "Line 8, column 19" in page and "Line 13" in page
    initial = initial_of(response)
    assert initial["text"] == text and initial["mode"] == "json"
    assert {p["path"] for p in initial["problems"]} == {"taskRoles[0].memoryMB", "retryCount"}
    assert not Job.objects.filter(owner=alice).exists()


def test_it_shows_a_syntax_error_of_a_rejected_submit_without_javascript(alice):
    text = '{"jobName": "x",, "image": "busybox"}'
    response = client_for(alice).post(SUBMIT, {"config": text})
    assert response.status_code == 200
    assert "Line 1, column 17" in response.content.decode()
    assert initial_of(response)["syntaxOk"] is False


def test_it_refuses_an_oversized_paste_with_a_clear_message(alice):
    response = client_for(alice).post(SUBMIT, {"config": " " * (300 * 1024)})
    assert response.status_code == 200
    assert "at most" in initial_of(response)["problems"][0]["message"]


# ----------------------------------------------------------------- clone


@pytest.fixture
def commented_job(alice):
    name = unique("exp")
    text = '{\n  // tuned by hand\n  "jobName": "%s",\n  "image": "%s",\n  "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0, "command": "echo hi"}],\n  "extras": {"seed": 7}\n}' % (name, BUSYBOX_IMAGE)
    return submit(alice, text)


def test_it_clones_a_job_as_submitted_with_a_new_name(alice, commented_job):
    response = client_for(alice).get(SUBMIT, {"clone": commented_job.pk})
    initial = initial_of(response)
    assert initial["value"]["jobName"] == f"{commented_job.name}_2"
    assert initial["text"] == commented_job.config_raw.replace(commented_job.name, f"{commented_job.name}_2")
    assert "// tuned by hand" in initial["text"] and initial["value"]["extras"] == {"seed": 7}
    assert initial["problems"] == []


def test_it_names_a_clone_of_a_clone_after_the_original(alice, commented_job):
    clone = submit(alice, json.dumps({**commented_job.config, "jobName": f"{commented_job.name}_2"}))
    response = client_for(alice).get(SUBMIT, {"clone": clone.pk})
    assert initial_of(response)["value"]["jobName"] == f"{commented_job.name}_3"


def test_it_lets_only_the_owner_and_admins_clone(alice, bob, admin_user, commented_job):
    assert client_for(bob).get(SUBMIT, {"clone": commented_job.pk}).status_code == 404
    assert client_for(bob).get(SUBMIT, {"clone": "nope"}).status_code == 404
    response = client_for(admin_user).get(SUBMIT, {"clone": commented_job.pk})
    assert response.status_code == 200
    # The admin's own name space: the original name is free for them.
    assert initial_of(response)["value"]["jobName"] == commented_job.name


def test_it_prefills_folders_into_a_clone_too(alice, commented_job):
    response = client_for(alice).get(SUBMIT, {"clone": commented_job.pk, "dataDir": f"/{alice.username}/data"})
    cfg = initial_of(response)["value"]
    assert cfg["jobName"] == f"{commented_job.name}_2"
    assert cfg["dataDir"] == f"/{alice.username}/data" and cfg["extras"] == {"seed": 7}


# ------------------------------------------------------------- protocol v2

EXAMPLES_V2 = Path(__file__).parent / "data" / "examples_v2"
SECRET = "s3cr3t-value-for-tests"

SIMPLE_V2 = """protocolVersion: 2
name: NAME
type: job
description: kept as it is
prerequisites:
  - name: busybox
    type: dockerimage
    uri: %s
taskRoles:
  main:
    instances: 1
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0, ports: {http: 1}}
    dockerImage: busybox
    commands:
      - echo one
      - echo two
defaults:
  virtualCluster: default
""" % BUSYBOX_IMAGE


def v2_secret_config(name: str) -> str:
    return (EXAMPLES_V2 / "hello_secrets.yaml").read_text().replace("name: hello_v2", f"name: {name}")


def test_it_reports_a_yaml_problem_at_its_line_and_column(alice):
    text = "protocolVersion: 2\nname: x\ntype: job\ntaskRoles:\n  main:\n    instances: [1\n"
    result = validate(client_for(alice), text)
    assert result["protocol"] == 2 and not result["syntaxOk"]
    assert result["problems"][0]["line"] >= 6 and result["problems"][0]["column"]


def test_it_points_v2_field_problems_at_their_line_and_form_field(alice):
    text = SIMPLE_V2.replace("NAME", unique("v2bad")).replace("memoryMB: 256", "memoryMB: 50")
    result = validate(client_for(alice), text)
    problem = next(p for p in result["problems"] if "memoryMB" in p["path"])
    assert problem["path"] == "taskRoles.main.resourcePerInstance.memoryMB"
    assert problem["field"] == "taskRoles[0].memoryMB"
    line = text.split("\n")[11]
    assert (problem["line"], problem["column"]) == (12, line.index("50") + 1)


def test_it_shows_a_v2_config_in_the_form_and_exports_it_as_v1(alice):
    name = unique("v2form")
    result = validate(client_for(alice), SIMPLE_V2.replace("NAME", name))
    assert result["problems"] == [] and result["formNote"] == ""
    assert result["value"] == {
        "jobName": name, "image": BUSYBOX_IMAGE, "virtualCluster": "default", "description": "kept as it is",
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0,
                       "portList": [{"label": "http", "beginAt": 0, "portNumber": 1}],
                       "command": "echo one && echo two"}],
    }
    exported = json.loads(result["otherText"])
    assert exported["jobName"] == name
    assert exported["taskRoles"][0]["shmMB"] == 256  # v2's default (at most memoryMB), written out for v1


def test_it_writes_form_edits_of_a_v2_draft_back_as_yaml(alice):
    client = client_for(alice)
    value = validate(client, SIMPLE_V2.replace("NAME", unique("v2edit")))["value"]
    value["taskRoles"][0]["memoryMB"] = 512
    response = client.post(VALIDATE, {"config": "", "form": json.dumps(value)})
    result = response.json()
    assert result["problems"] == [] and result["protocol"] == 2
    assert "memoryMB: 512" in result["text"] and "description: kept as it is" in result["text"]
    assert validate(client, result["text"])["value"] == value


def test_it_says_what_the_form_cannot_show_of_a_v2_config_and_never_echoes_secrets(alice):
    result = validate(client_for(alice), v2_secret_config(unique("v2sec")))
    assert result["problems"] == []
    assert result["value"] is None and result["otherText"] is None
    assert result["formNote"].startswith("this v2 config uses parameters, secrets and")
    assert result["formNote"].endswith("which the form cannot show; edit it as YAML (the JSON / YAML button)")
    assert SECRET not in json.dumps(result)


def test_it_keeps_a_v2_config_with_an_image_per_task_role_as_yaml_and_says_why(alice):
    text = SIMPLE_V2.replace("NAME", unique("v2imgs")).replace("defaults:", """  other:
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    dockerImage: debian
    commands: [python3 -c 'print(42)']
defaults:""").replace("taskRoles:", """  - name: debian
    type: dockerimage
    uri: pai-local/debian:bookworm
taskRoles:""")
    result = validate(client_for(alice), text)
    assert result["problems"] == [] and result["protocol"] == 2
    assert result["value"] is None
    assert result["formNote"] == ("this v2 config uses several Docker images, which the form cannot show; "
                                  "edit it as YAML (the JSON / YAML button)")


def test_it_queues_a_v2_config_pasted_into_the_page(alice):
    name = unique("v2page")
    response = client_for(alice).post(SUBMIT, {"config": v2_secret_config(name), "mode": "json"})
    assert response.status_code == 302
    job = Job.objects.get(owner=alice, name=name)
    assert job.config_raw.startswith("# One task") and SECRET not in job.config_raw
    assert "'******'" in job.config_raw


def test_it_keeps_secrets_out_of_a_rejected_v2_submit_beyond_the_text_typed(alice):
    text = v2_secret_config(unique("v2rej")).replace("memoryMB: 256", "memoryMB: 50")
    response = client_for(alice).post(SUBMIT, {"config": text, "mode": "json"})
    assert response.status_code == 200
    page = response.content.decode()
    # The textarea and the script's copy of the same text: what the user posted, nothing more.
    assert page.count(SECRET) == 2
    initial = initial_of(response)
    assert SECRET not in json.dumps({k: v for k, v in initial.items() if k != "text"})


def test_it_clones_a_v2_job_with_its_secrets_masked(alice):
    job = submit(alice, v2_secret_config(unique("v2clone")))
    response = client_for(alice).get(SUBMIT, {"clone": job.pk})
    page = response.content.decode()
    assert SECRET not in page
    text = initial_of(response)["text"]
    assert text.startswith("# One task") and f"name: \"{job.name}_2\"" in text
    masked = [p for p in initial_of(response)["problems"] if p["path"] == "secrets.api_key"]
    assert masked and "type its value" in masked[0]["message"]


@pytest.mark.parametrize("style", ["|-", ">-", "|2-"])
def test_it_clones_a_v2_job_whose_name_is_a_block_scalar_into_yaml_that_reads(alice, style):
    """A block scalar's span runs to the start of the next line: the new
    name took its line break, and `type: job` came to stand on the name's
    line (YAML that no longer read)."""
    from jobs.spec import read_config

    name = unique("v2block")
    job = submit(alice, SIMPLE_V2.replace("name: NAME", f"name: {style}\n  {name}\n"))
    text = initial_of(client_for(alice).get(SUBMIT, {"clone": job.pk}))["text"]
    assert f'name: "{name}_2"\n\ntype: job\n' in text or f'name: "{name}_2"\ntype: job\n' in text
    assert read_config(text).value["name"] == f"{name}_2"
