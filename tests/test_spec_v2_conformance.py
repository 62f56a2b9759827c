"""Protocol v2 as OpenPAI 1.x reads it, where the schema alone does not say:
the defaults its REST server applies (rest-server models/v2/job/k8s.js),
what it renders with secrets (middlewares/v2/protocol.js), and what its
runtime plugins ignore rather than refuse (kube-runtime plugins/ssh)."""

from __future__ import annotations

import json

import pytest
import yaml

from jobs.spec import ParsedConfig, SpecError, parse_config_text
from jobs.spec import convert
from tests import test_spec_v2

FS = "hdfs://namenode:9000"


def minimal(**changes) -> dict:
    """test_spec_v2's minimal config, with memory enough for OpenPAI's 512 MB
    of /dev/shm (the default is capped at memoryMB)."""
    config = test_spec_v2.minimal()
    config["taskRoles"]["main"]["resourcePerInstance"]["memoryMB"] = 2048
    config.update(changes)
    return config


def with_role(**fields) -> dict:
    config = minimal()
    config["taskRoles"]["main"].update(fields)
    return config


def parse(config: dict) -> ParsedConfig:
    return parse_config_text(yaml.safe_dump(config, sort_keys=False), user_name="alice", default_fs_uri=FS)


def problems(config: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse(config)
    return [str(p) for p in caught.value.problems]


# -------------------------------------------------------------- shared memory


def test_it_gives_a_role_without_shm_openpais_512_mb():
    assert parse(minimal()).spec.role("main").shm_mb == 512


def test_it_reads_a_zero_shm_as_the_default_as_openpai_does():
    assert parse(with_role(extraContainerOptions={"shmMB": 0})).spec.role("main").shm_mb == 512


def test_the_default_shm_never_exceeds_a_small_roles_memory():
    config = minimal()
    config["taskRoles"]["main"]["resourcePerInstance"]["memoryMB"] = 256
    assert parse(config).spec.role("main").shm_mb == 256


def test_it_keeps_a_shm_the_role_gives_and_still_refuses_one_above_its_memory():
    assert parse(with_role(extraContainerOptions={"shmMB": 64})).spec.role("main").shm_mb == 64
    assert any("taskRoles.main.extraContainerOptions.shmMB: expected at most memoryMB (2048), got 4096" in p
               for p in problems(with_role(extraContainerOptions={"shmMB": 4096})))


def test_export_writes_each_protocols_default_shm_out():
    form, uses = convert.v2_as_form(minimal())
    assert uses == [] and "shmMB" not in form["taskRoles"][0]  # the form shows the config as typed
    assert convert.v1_export(form)["taskRoles"][0]["shmMB"] == 512
    v1 = {"jobName": "j", "image": "busybox", "taskRoles": [
        {"name": "a", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 512, "gpuNumber": 0, "command": "x"},
        {"name": "b", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 512, "gpuNumber": 0, "command": "x", "shmMB": 0},
        {"name": "c", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 512, "gpuNumber": 0, "command": "x", "shmMB": 32},
    ]}
    value, cannot = convert.form_as_v2(v1)
    assert cannot == []
    exported = convert.v2_export(value)
    assert [role["extraContainerOptions"]["shmMB"] for role in exported["taskRoles"].values()] == [64, 64, 32]
    assert [role.shm_mb for role in parse(exported).spec.task_roles] == [64, 64, 32]
    assert json.dumps(value) != json.dumps(exported)  # the form's own conversion is left as it was


# --------------------------------------------------------- completion policy


@pytest.mark.parametrize("given", [None, 0])
def test_a_null_or_zero_min_failed_is_the_default_as_in_openpai_1_with_a_warning(given):
    parsed = parse(with_role(instances=2, completion={"minFailedInstances": given}))
    assert parsed.spec.role("main").min_failed_task_count == 1
    [warning] = parsed.warnings
    assert warning.path == "taskRoles.main.completion.minFailedInstances"
    assert "the job fails when 1 task fails; write -1 for task failures never to fail the job" in warning.message


def test_a_null_or_zero_min_succeeded_is_all_tasks_and_only_zero_is_warned():
    null = parse(with_role(instances=2, completion={"minSucceededInstances": None}))
    zero = parse(with_role(instances=2, completion={"minSucceededInstances": 0}))
    assert null.spec.role("main").min_succeeded_task_count is zero.spec.role("main").min_succeeded_task_count is None
    assert null.warnings == [] and [w.path for w in zero.warnings] == [
        "taskRoles.main.completion.minSucceededInstances"]


def test_minus_one_still_means_never_and_all():
    role = parse(with_role(completion={"minFailedInstances": -1, "minSucceededInstances": -1})).spec.role("main")
    assert (role.min_failed_task_count, role.min_succeeded_task_count) == (None, None)


# ------------------------------------------------------- registry credentials


def private_image(**auth: str) -> dict:
    config = minimal(secrets={"user": "robot-user", "pw": "registry-pass-5150", "host": "registry.example.org"})
    config["prerequisites"][0]["auth"] = auth
    return config


def test_every_auth_field_may_name_a_secret_and_keeps_it_a_reference():
    parsed = parse(private_image(username="<% $secrets.user %>", password="<%$secrets.pw%>",
                                 registryuri="<% $secrets.host %>"))
    assert parsed.spec.image_auth == {"registry": "<% $secrets.host %>", "username": "<% $secrets.user %>",
                                      "password": "<% $secrets.pw %>"}
    stored = json.dumps(parsed.spec.to_config())
    assert not any(value in stored for value in parsed.secrets.values())


def test_the_node_pulls_with_the_secrets_the_auth_names():
    from types import SimpleNamespace

    from jobs import keys
    from jobs.node.launcher import RegistryAuth
    from jobs.node.runner import config_registry_auth

    parsed = parse(private_image(username="team-<% $secrets.user %>", password="<% $secrets.pw %>",
                                 registryuri="registry.example.org"))
    ctx = SimpleNamespace(spec=parsed.spec, me=SimpleNamespace(role="main"),
                          job=SimpleNamespace(secrets_sealed=keys.seal_secrets(parsed.secrets)))
    auth = config_registry_auth(ctx)
    assert (auth.registry, auth.username, auth.password) == (
        "registry.example.org", "team-robot-user", "registry-pass-5150")
    # Every secret of the job, the one inside the username too, is kept out of the pull's messages.
    from jobs.node.launcher.docker import _scrub

    message = "pull access denied for team-robot-user with registry-pass-5150 at registry.example.org"
    # (private_image's secrets hold the registry's name too, so it goes as well.)
    assert _scrub(message, auth) == "pull access denied for team-******** with ******** at ********"


@pytest.mark.parametrize("auth, words", [
    ({"username": "<% $secrets.nobody %>", "password": "<% $secrets.pw %>"},
     "prerequisites[0].auth.username: <% $secrets.nobody %>: there is no secrets.nobody"),
    ({"username": "u", "password": "<% $secrets.nobody %>"},
     "prerequisites[0].auth.password: <% $secrets.nobody %>: there is no secrets.nobody"),
    ({"username": "<% $parameters.user %>", "password": "<% $secrets.pw %>"},
     "prerequisites[0].auth.username: <% $parameters.user %>: a dockerimage's auth takes <% $secrets.name %> "
     "references only"),
])
def test_it_names_an_auth_reference_to_nothing(auth, words):
    assert any(p.startswith(words) for p in problems(private_image(**auth))), problems(private_image(**auth))


# ------------------------------------------------------------ runtime plugins


@pytest.mark.parametrize("userssh", [{"type": "custom"}, {"type": "custom", "value": ""}])
def test_an_ssh_plugins_userssh_without_a_value_is_skipped_with_a_warning(userssh):
    from jobs.spec.v2 import plugin_ssh_keys

    plugin = {"plugin": "ssh", "parameters": {"jobssh": True, "userssh": userssh}}
    parsed = parse(minimal(extras={"com.microsoft.pai.runtimeplugin": [plugin]}))
    assert plugin_ssh_keys(parsed.spec.extras) == []
    assert [w.path for w in parsed.warnings] == ["extras.com.microsoft.pai.runtimeplugin[0].parameters.userssh"]


def test_an_ssh_plugins_userssh_that_is_not_a_key_is_still_refused():
    plugin = {"plugin": "ssh", "parameters": {"userssh": {"type": "custom", "value": "not a key"}}}
    assert any(p.startswith("extras.com.microsoft.pai.runtimeplugin[0].parameters.userssh.value: expected OpenSSH")
               for p in problems(minimal(extras={"com.microsoft.pai.runtimeplugin": [plugin]})))


# --------------------------------------------------------------- deployments


def test_a_deployment_for_a_task_role_the_job_has_not_is_warned_and_unused():
    config = minimal(deployments=[{"name": "prod", "taskRoles": {"main": {"preCommands": ["echo pre"]},
                                                                "gone": {"preCommands": ["echo never"]}}}],
                     defaults={"deployment": "prod"})
    parsed = parse(config)
    assert parsed.spec.role("main").command == "echo pre && echo hi"
    [warning] = parsed.warnings
    assert (warning.path, warning.message) == (
        "deployments[0].taskRoles.gone", 'task role "gone" is not in taskRoles, so these commands are not used')


# ------------------------------------------------------------- hivedScheduler


def test_a_hived_sku_for_a_task_role_the_job_has_not_is_refused():
    config = minimal(extras={"hivedScheduler": {"taskRoles": {"mian": {"skuType": "V100"}}}})
    assert problems(config)[0].startswith(
        'extras.hivedScheduler.taskRoles.mian: task role "mian" is not in taskRoles; task roles: main')


def test_a_hived_sku_of_the_jobs_task_role_is_its_gpu_type_and_the_priority_class_is_warned():
    config = minimal(extras={"hivedScheduler": {"jobPriorityClass": "prod",
                                                "taskRoles": {"main": {"skuNum": 1, "skuType": "K80"}}}})
    parsed = parse(config)
    assert parsed.spec.gpu_type == "K80"
    assert [w.path for w in parsed.warnings] == ["extras.hivedScheduler.jobPriorityClass"]


def test_a_runtime_plugin_not_available_here_is_named_in_its_warning():
    plugin = {"plugin": "teamwise_storage", "parameters": {"storageConfigNames": ["confignfs"]}}
    [warning] = parse(minimal(extras={"com.microsoft.pai.runtimeplugin": [plugin]})).warnings
    assert (warning.path, warning.message) == (
        "extras.com.microsoft.pai.runtimeplugin[0]",
        'the runtime plugin "teamwise_storage" is not available here and is ignored (of OpenPAI\'s plugins, '
        'only "ssh" is)')


@pytest.mark.parametrize(("change", "named"), [
    ({"jobName": "train.v2"}, "jobName 'train.v2'"),
    ({"role": {"name": "ps.server"}}, "taskRoles[0].name 'ps.server'"),
    ({"role": {"name": "1st"}}, "taskRoles[0].name '1st'"),
    ({"role": {"command": "echo '<% not a reference %>'"}}, "taskRoles[0].command"),
    ({"role": {"portList": [{"label": "tensor.board", "beginAt": 0, "portNumber": 1}]}}, "taskRoles[0].portList"),
])
def test_export_to_v2_names_what_v2_would_refuse_rather_than_writing_it(change, named):
    """These v1 configs were exported as v2 YAML that the v2 parser then
    refused (or read differently: <% starts a reference in v2)."""
    v1 = {"jobName": "ok_job", "image": "busybox", "taskRoles": [
        {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 512, "gpuNumber": 0, "command": "echo hi"}]}
    v1.update({key: value for key, value in change.items() if key != "role"})
    v1["taskRoles"][0].update(change.get("role", {}))
    value, cannot = convert.form_as_v2(v1)
    assert value is None and any(item.startswith(named) for item in cannot), cannot
    v1 = {**v1, "jobName": "ok_job", "taskRoles": [{**v1["taskRoles"][0], "name": "main", "command": "echo hi",
                                                      "portList": []}]}
    value, cannot = convert.form_as_v2(v1)
    assert cannot == [] and parse(convert.v2_export(value)).spec.job_name == "ok_job"
