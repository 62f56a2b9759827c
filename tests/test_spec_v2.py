"""Protocol v2 (YAML): OpenPAI's fields into the same JobSpec as v1, every
problem at once with its path and place, YAML read safely, and secrets kept
out of everything stored or shown."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from jobs.spec import JobSpec, SpecError, parse_config_text, protocol_of
from jobs.spec.v2_text import MASK, resolve_secrets
from jobs.spec.yaml_reader import MAX_EXPANDED_NODES

EXAMPLES = Path(__file__).parent / "data" / "examples_v2"
V1_EXAMPLES = Path(__file__).parent / "data" / "examples"
FS = "hdfs://namenode:9000"


def parse(text: str | dict, user: str = "alice"):
    if isinstance(text, dict):
        text = yaml.safe_dump(text, sort_keys=False)
    return parse_config_text(text, user_name=user, default_fs_uri=FS)


def example(name: str) -> str:
    return (EXAMPLES / name).read_text()


def problems(text: str | dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse(text)
    return [str(p) for p in caught.value.problems]


def minimal(**changes) -> dict:
    config = {
        "protocolVersion": 2, "name": "v2job", "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "busybox"}],
        "taskRoles": {"main": {"dockerImage": "img", "resourcePerInstance": {"cpu": 1, "memoryMB": 256, "gpu": 0},
                               "commands": ["echo hi"]}},
    }
    config.update(changes)
    return config


def _stored(spec: JobSpec) -> dict:
    return json.loads(json.dumps(spec.to_config(), ensure_ascii=False))


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_it_parses_every_v2_example_and_round_trips_its_spec(name):
    parsed = parse(example(name))
    assert parsed.protocol_version == 2
    assert JobSpec.from_config(_stored(parsed.spec)) == parsed.spec


def test_it_maps_a_multi_role_job_onto_the_same_spec_as_v1():
    spec = parse(example("distributed.yaml")).spec
    assert spec.job_name == "tf_distributed" and spec.image == "pai-local/busybox:latest"
    assert spec.virtual_cluster == "default" and spec.retry_count == 1
    assert spec.output_dir == f"{FS}/Output/alice/tf_distributed"
    assert [r.name for r in spec.task_roles] == ["ps_server", "worker"]
    ps, worker = spec.role("ps_server"), spec.role("worker")
    assert (ps.task_number, ps.cpu_number, ps.memory_mb, ps.gpu_number, ps.shm_mb) == (1, 1, 256, 0, 64)
    assert [(p.label, p.begin_at, p.port_number) for p in ps.ports] == [("http", 0, 1)]
    assert (ps.min_failed_task_count, ps.min_succeeded_task_count) == (1, None)
    assert (worker.task_number, worker.min_failed_task_count, worker.min_succeeded_task_count) == (2, 1, 2)
    assert ps.command == "echo ps resnet20 https://example.org/cifar-10-python.tar.gz"


def test_it_runs_pre_commands_then_commands_then_post_commands_with_references_substituted():
    worker = parse(example("distributed.yaml")).spec.role("worker")
    assert worker.command == (
        "git clone https://alice:<% $secrets.github_token %>@github.com/example/benchmarks script_benchmarks"
        " && cd script_benchmarks"
        " && echo train --model=resnet20 --batch_size=32 --steps=100,200"
        " && echo done 84820935")


def test_it_keeps_secrets_out_of_the_spec_and_gives_them_to_the_node_only():
    parsed = parse(example("distributed.yaml"))
    secret = "ghp-very-secret-token-1234"
    assert parsed.secrets == {"github_token": secret}
    assert secret not in json.dumps(parsed.spec.to_config())
    assert secret not in repr(parsed)
    command = resolve_secrets(parsed.spec.role("worker").command, parsed.secrets)
    assert command.startswith(f"git clone https://alice:{secret}@github.com/")


def test_it_masks_secrets_in_the_text_it_keeps_and_keeps_comments():
    parsed = parse(example("distributed.yaml"))
    assert "ghp-very-secret-token-1234" not in parsed.raw
    assert f"github_token: '{MASK}'   # never shown again" in parsed.raw
    assert "# A parameter server and two workers" in parsed.raw
    again = yaml.safe_load(parsed.raw)
    assert again["secrets"] == {"github_token": MASK}
    assert again["taskRoles"] == yaml.safe_load(example("distributed.yaml"))["taskRoles"]


def test_it_masks_block_flow_and_nested_secrets_and_every_other_spelling():
    text = example("hello_secrets.yaml").replace(
        "secrets:\n  api_key: s3cr3t-value-for-tests\n",
        "secrets:\n  api_key: s3cr3t-value-for-tests\n  multi: |\n    line one\n    line two\n"
        "  nested: {inner: nested-secret-42}\n# api_key was s3cr3t-value-for-tests\n")
    parsed = parse(text)
    for secret in ("s3cr3t-value-for-tests", "line one", "nested-secret-42"):
        assert secret not in parsed.raw
    assert yaml.safe_load(parsed.raw)["secrets"] == {"api_key": MASK, "multi": MASK, "nested": {"inner": MASK}}


def test_it_takes_the_same_structure_as_json():
    from_yaml = parse(example("distributed.yaml"))
    as_json = json.dumps(yaml.safe_load(example("distributed.yaml")))
    assert protocol_of(as_json) == 2
    from_json = parse(as_json)
    assert from_json.spec == from_yaml.spec
    assert "ghp-very-secret-token-1234" not in from_json.raw and json.loads(from_json.raw)["secrets"] == {
        "github_token": MASK}


def test_it_still_reads_v1_json_through_the_same_entry_point():
    text = (V1_EXAMPLES / "helloworld-nvidia-smi.json").read_text()
    assert protocol_of(text) == 1
    assert parse(text).protocol_version == 1
    assert protocol_of('// comment\n{"jobName": "x", "protocolVersion": 2}') == 1


def test_it_maps_completion_policy_ports_shm_and_retries():
    parsed = parse(example("completion_policy.yaml"))
    spec = parsed.spec
    chief, worker = spec.role("chief"), spec.role("worker")
    assert (chief.min_failed_task_count, chief.min_succeeded_task_count) == (1, 1)
    assert (worker.min_failed_task_count, worker.min_succeeded_task_count) == (None, None)
    assert worker.shm_mb == 128 and worker.task_number == 3 and spec.retry_count == 2
    assert [(p.label, p.port_number) for p in chief.ports] == [("http", 1), ("ssh_extra", 2)]
    assert chief.command == "sleep 1 && echo chief done"


def test_it_keeps_the_image_password_as_a_secret_reference_and_maps_the_sku():
    parsed = parse(example("private_image.yaml"))
    spec = parsed.spec
    assert spec.image == "registry.example.org/team/trainer:1.0" and spec.gpu_type == "V100"
    assert spec.image_auth == {"registry": "registry.example.org", "username": "robot",
                               "password": "<% $secrets.registry_password %>"}
    assert "registry-pass-9876" not in json.dumps(spec.to_config()) and "registry-pass-9876" not in parsed.raw
    assert resolve_secrets(spec.image_auth["password"], parsed.secrets) == "registry-pass-9876"
    assert spec.extras["myTeamNote"] == "kept but unused"
    assert [w.path for w in parsed.warnings] == ["extras.myTeamNote"]


def test_it_reports_every_problem_at_once_with_its_path_and_place():
    text = """protocolVersion: 2
name: bad name
type: jobx
surprise: 1
prerequisites:
  - {name: img, type: dockerimage, uri: busybox}
taskRoles:
  main:
    dockerImage: nope
    data: missing
    resourcePerInstance: {cpu: 0, memoryMB: 10, gpu: 1, disk: 3}
    extraContainerOptions: {privileged: true}
    completion: {minFailedInstances: 2}
    commands: ["echo <% $parameters.x %>"]
defaults: {deployment: prod}
"""
    found = problems(text)
    expected = [
        'surprise: unknown field "surprise"', "(line 4, column 11)",
        'type: expected "job"', "(line 3, column 7)",
        "name: expected letters, digits, _ and -", "(line 2, column 7)",
        'taskRoles.main.dockerImage: names dockerimage prerequisite "nope", which does not exist',
        'taskRoles.main.data: names data prerequisite "missing", which does not exist',
        "taskRoles.main.resourcePerInstance.cpu: expected at least 1",
        "taskRoles.main.resourcePerInstance.memoryMB: expected at least 100 MB",
        'taskRoles.main.resourcePerInstance.disk: unknown field "disk"',
        'taskRoles.main.extraContainerOptions.privileged: "privileged" is not supported',
        "taskRoles.main.completion.minFailedInstances: expected -1 or between 1 and instances (1), got 2",
        "taskRoles.main.commands[0]: <% $parameters.x %>: there is no parameters.x (line 14, column 16)",
        'defaults.deployment: deployment "prod" does not exist',
    ]
    joined = "\n".join(found)
    for words in expected:
        assert words in joined, (words, joined)


@pytest.mark.parametrize("change, words", [
    ({"protocolVersion": 1}, "protocolVersion: expected 2"),
    ({"taskRoles": {}}, "taskRoles: expected at least one task role"),
    ({"taskRoles": {"1bad": {}}}, "taskRoles.1bad: a task role's name is letters"),
    ({"prerequisites": [{"name": "img", "type": "dockerimage", "uri": "busybox"},
                        {"name": "img", "type": "dockerimage", "uri": "busybox"}]},
     'prerequisites[1].name: duplicate dockerimage prerequisite "img"'),
    ({"prerequisites": [{"name": "img", "type": "dockerimage", "uri": "a", "plugin": "cmd"}]},
     "runtime-plugin prerequisites"),
    ({"deployments": [{"name": "d", "taskRoles": {"gh-ost": {"preCommands": ["x"]}}}]},
     "deployments[0].taskRoles.gh-ost: a task role's name is letters, digits and _"),
    ({"deployments": [{"name": "d", "taskRoles": {"main": {"setup": ["x"]}}}]},
     'deployments[0].taskRoles.main.setup: unknown field "setup"'),
])
def test_it_refuses_what_the_schema_forbids(change, words):
    assert any(words in p for p in problems(minimal(**change))), problems(minimal(**change))


def two_images() -> dict:
    """Three task roles over two images: main and again on a, other on b
    (with its own registry login)."""
    config = minimal(prerequisites=[
        {"name": "a", "type": "dockerimage", "uri": "busybox"},
        {"name": "b", "type": "dockerimage", "uri": "registry.example.org/team/debian:12",
         "auth": {"username": "robot", "password": "<% $secrets.pw %>", "registryuri": "registry.example.org"}},
    ], secrets={"pw": "registry-pass-5150"})
    config["taskRoles"]["main"]["dockerImage"] = "a"
    config["taskRoles"]["other"] = {**config["taskRoles"]["main"], "dockerImage": "b"}
    config["taskRoles"]["again"] = {**config["taskRoles"]["main"], "dockerImage": "a"}
    return config


def test_it_runs_each_task_role_in_its_own_image_with_its_own_login():
    parsed = parse(two_images())
    spec = parsed.spec
    assert (spec.image, spec.image_auth) == ("busybox", None)  # the first role's: what pages show
    main, other, again = spec.task_roles
    assert (main.image, again.image) == (None, None)  # the job's, stored as before
    assert other.image == "registry.example.org/team/debian:12"
    assert other.image_auth == {"registry": "registry.example.org", "username": "robot",
                                "password": "<% $secrets.pw %>"}
    assert spec.role_image("main") == spec.role_image("again") == ("busybox", None)
    assert spec.role_image("other") == (other.image, other.image_auth)
    assert resolve_secrets(other.image_auth["password"], parsed.secrets) == "registry-pass-5150"
    stored = _stored(spec)
    assert "registry-pass-5150" not in json.dumps(stored)
    assert [role.get("roleImage") for role in stored["taskRoles"]] == [None, other.image, None]
    assert JobSpec.from_config(stored) == spec
    assert json.dumps(JobSpec.from_config(stored).to_config()) == json.dumps(stored)


def test_a_role_with_its_own_image_never_gets_the_jobs_login():
    config = two_images()
    config["taskRoles"] = {"other": config["taskRoles"]["other"], "main": config["taskRoles"]["main"]}
    spec = parse(config).spec
    assert spec.image == "registry.example.org/team/debian:12" and spec.image_auth["username"] == "robot"
    assert spec.role_image("main") == ("busybox", None)


def test_it_names_a_task_role_whose_image_does_not_exist():
    config = two_images()
    config["taskRoles"]["other"]["dockerImage"] = "c"
    assert any(p.startswith('taskRoles.other.dockerImage: names dockerimage prerequisite "c", which does not exist')
               for p in problems(config))


def test_it_names_the_field_of_a_reference_to_a_role_without_that_prerequisite():
    config = minimal()
    config["taskRoles"]["main"]["commands"] = ["cat <% $script.uri %>"]
    [found] = problems(config)
    assert found.startswith("taskRoles.main.commands[0]: <% $script.uri %>: the task role names no script "
                            "prerequisite (taskRoles.main.script) (line ")


def test_it_warns_about_what_it_keeps_but_does_not_use():
    config = minimal(extras={"gangAllocation": False, "somethingElse": 1,
                             "com.microsoft.pai.runtimeplugin": [{"plugin": "tensorboard"}]})
    config["taskRoles"]["main"]["taskRetryCount"] = 2
    config["taskRoles"]["main"]["extraContainerOptions"] = {"infiniband": True}
    warnings = {w.path for w in parse(config).warnings}
    assert warnings == {"extras.gangAllocation", "extras.somethingElse", "extras.com.microsoft.pai.runtimeplugin[0]",
                        "taskRoles.main.taskRetryCount", "taskRoles.main.extraContainerOptions.infiniband"}


def test_it_refuses_a_literal_registry_password_without_repeating_it():
    config = minimal()
    config["prerequisites"][0]["auth"] = {"username": "u", "password": "plain-password-1"}
    found = problems(config)
    assert any("prerequisites[0].auth.password: expected a reference to a secret" in p for p in found)
    assert not any("plain-password-1" in p for p in found)


def test_no_message_quotes_a_secret():
    # A YAML error inside the secrets, a secret of the wrong shape, and a
    # secret that is also (wrongly) the job's name.
    for text in (
        "protocolVersion: 2\nsecrets:\n  pw: \"hunter2-secret\n",
        yaml.safe_dump(minimal(secrets={"pw": ["hunter2-secret"]})),
        yaml.safe_dump(minimal(secrets={"pw": "hunter2 secret"}, name="hunter2 secret")),
    ):
        found = problems(text)
        assert found and not any("hunter2" in p for p in found), found


def test_it_refuses_anchors_and_aliases_on_secrets():
    text = yaml.safe_dump(minimal()) + "secrets:\n  pw: &pw hunter2-secret\nparameters:\n  copy: *pw\n"
    assert any("secrets may not use YAML anchors" in p for p in problems(text))


@pytest.mark.parametrize("text, words", [
    ("a: !!python/object/apply:os.system [echo]\n", "is not allowed here"),
    ("a: !custom x\n", "is not allowed here"),
    ("protocolVersion: 2\n" + "a: " + "[" * 50 + "]" * 50 + "\n", "nested more than"),
    ("protocolVersion: 2\na: &a [*a]\n", "recursive alias"),
    ("protocolVersion: 2\nname: x\nname: y\n", 'duplicate key "name"'),
    ("protocolVersion: 2\nname: [x\n", "invalid YAML"),
])
def test_it_reads_yaml_safely(text, words):
    found = problems("protocolVersion: 2\n" + text if not text.startswith("protocolVersion") else text)
    assert any(words in p for p in found), found


def test_an_alias_bomb_gets_a_clear_error_quickly():
    lines = ["protocolVersion: 2", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    started = time.monotonic()
    found = problems("\n".join(lines) + "\n")
    assert time.monotonic() - started < 2
    assert any(f"more than {MAX_EXPANDED_NODES} values" in p and "line " in p for p in found), found


def test_it_reads_scalars_as_openpai_did():
    config = yaml.safe_dump(minimal(parameters={"flag": "yes", "day": "2020-01-01"}))
    config = config.replace("'yes'", "yes").replace("'2020-01-01'", "2020-01-01")
    config = config.replace("echo hi", "echo <% $parameters.flag %> <% $parameters.day %>")
    assert parse(config).spec.role("main").command == "echo yes 2020-01-01"


def test_a_secret_reference_in_the_text_of_a_parameter_is_only_text_until_the_node():
    config = minimal(parameters={"p": "value"}, secrets={"k": "the-key-value"})
    config["taskRoles"]["main"]["commands"] = ["echo <% $parameters.p %> <% $secrets.k %>"]
    parsed = parse(config)
    assert parsed.spec.role("main").command == "echo value <% $secrets.k %>"
    assert resolve_secrets(parsed.spec.role("main").command, parsed.secrets) == "echo value the-key-value"


def test_a_secret_typed_out_in_a_command_is_stored_as_its_reference():
    config = minimal(secrets={"k": "the-key-value"})
    config["taskRoles"]["main"]["commands"] = ["# the-key-value is here", "echo the-key-value"]
    parsed = parse(yaml.safe_dump(config, sort_keys=False) + "# and the-key-value in a comment\n")
    command = parsed.spec.role("main").command
    assert "the-key-value" not in command and "the-key-value" not in parsed.raw
    assert resolve_secrets(command, parsed.secrets) == "# the-key-value is here && echo the-key-value"
    assert "# and ****** in a comment" in parsed.raw  # masked in place, layout kept


def test_it_authorizes_the_ssh_plugins_public_keys_and_refuses_what_is_not_one():
    from jobs.spec.v2 import plugin_ssh_keys

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop"
    plugin = {"plugin": "ssh", "parameters": {"jobssh": True, "userssh": {"type": "custom", "value": key}}}
    parsed = parse(minimal(extras={"com.microsoft.pai.runtimeplugin": [plugin]}))
    assert plugin_ssh_keys(parsed.spec.extras) == [key]
    assert not [w for w in parsed.warnings if "userssh" in w.path]
    bad = {"plugin": "ssh", "parameters": {"userssh": {"type": "custom", "value": "not a key"}}}
    assert any("userssh.value" in p for p in problems(minimal(extras={"com.microsoft.pai.runtimeplugin": [bad]})))


@pytest.mark.parametrize("task_roles", [["main"], "main", 1, True])
def test_a_chosen_deployment_whose_task_roles_is_no_mapping_is_named_not_a_crash(task_roles):
    config = minimal(deployments=[{"name": "prod", "taskRoles": task_roles}], defaults={"deployment": "prod"})
    with pytest.raises(SpecError) as caught:
        parse(config)
    assert [p.path for p in caught.value.problems] == ["deployments[0].taskRoles"]


def test_a_deployment_takes_a_version_as_openpais_own_example_gives_it_and_warns_of_other_fields():
    config = minimal(deployments=[{"name": "prod", "version": 1.0, "owner": "lab",
                                   "taskRoles": {"main": {"preCommands": ["echo pre"]}}}],
                     defaults={"deployment": "prod"})
    parsed = parse(config)
    assert parsed.spec.role("main").command == "echo pre && echo hi"
    assert [w.path for w in parsed.warnings if w.path.startswith("deployments")] == ["deployments[0].owner"]


@pytest.mark.parametrize("name, value", [("admin_user", "admin"), ("db_password", "secret"), ("pass", "pass")])
def test_a_secret_spelled_inside_its_own_reference_still_reaches_the_container(name, value):
    config = minimal(secrets={name: value, "other": f"x{value}x"})
    config["taskRoles"]["main"]["commands"] = [f"login --user <% $secrets.{name} %> --also x{value}x {value}"]
    parsed = parse(config)
    command = parsed.spec.role("main").command
    assert command == f"login --user <% $secrets.{name} %> --also <% $secrets.other %> <% $secrets.{name} %>"
    assert resolve_secrets(command, parsed.secrets) == f"login --user {value} --also x{value}x {value}"


def test_the_kept_text_masks_secrets_but_not_the_names_a_clone_needs():
    text = """\
protocolVersion: 2
name: named_like_secrets
type: job
secrets:
  docker_password: password   # the password is password
  admin_user: admin
prerequisites:
  - name: img
    type: dockerimage
    uri: busybox
    auth: {username: <% $secrets.admin_user %>, password: <% $secrets.docker_password %>}
taskRoles:
  main:
    dockerImage: img
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands: ["echo <% $secrets.admin_user %> admin"]
"""
    parsed = parse(text)
    assert "docker_password: '******'   # the ****** is ******" in parsed.raw
    assert "admin_user: '******'" in parsed.raw
    assert "password: <% $secrets.docker_password %>" in parsed.raw
    assert '"echo <% $secrets.admin_user %> ******"' in parsed.raw
    # A clone: the same text with the secrets typed in again parses as the original did.
    again = parse(parsed.raw.replace("docker_password: '******'", "docker_password: password")
                  .replace("admin_user: '******'", "admin_user: admin"))
    assert again.spec.image_auth == parsed.spec.image_auth
    assert resolve_secrets(again.spec.role("main").command, again.secrets) == "echo admin ******"


@pytest.mark.parametrize("scalar", [".nan", ".inf", "-.Inf", "+.INF", "1e999"])
def test_a_number_json_cannot_hold_is_refused_with_its_field_and_line(scalar):
    found = problems(yaml.safe_dump(minimal(), sort_keys=False) + f"extras:\n  note: {scalar}\n")
    assert any(p.startswith("extras.note: ") and scalar in p and "(line 18, column 9)" in p and ("finite" in p or "too large" in p)
               for p in found), found
