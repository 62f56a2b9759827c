"""The job-config language: every reference example parses, every kind of
bad input gets its own clear message, and nothing else ever escapes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.spec import MAX_CONFIG_BYTES, JobSpec, SpecError, parse_job_config, substitute

EXAMPLES = Path(__file__).parent / "data" / "examples"
FS = "hdfs://namenode:9000"


def parse(value, user: str = "alice"):
    text = value if isinstance(value, (str, bytes)) else json.dumps(value)
    return parse_job_config(text, user_name=user, default_fs_uri=FS)


def good() -> dict:
    return {
        "jobName": "ok-job",
        "image": "busybox",
        "taskRoles": [{"name": "main", "taskNumber": 2, "cpuNumber": 1, "memoryMB": 512, "gpuNumber": 0,
                       "command": "echo hi"}],
    }


def problems(value) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse(value)
    return [str(p) for p in caught.value.problems]


def test_it_parses_the_complete_example_into_typed_objects():
    parsed = parse((EXAMPLES / "distributed-tensorflow-complete.jsonc").read_text())
    spec = parsed.spec
    assert spec.job_name == "tensorflow-distributed-jobguid"
    assert spec.data_dir == f"{FS}/path/tensorflow-distributed-jobguid/data"
    assert [r.name for r in spec.task_roles] == ["ps_server", "worker"]
    worker = spec.role("worker")
    assert worker.gpu_number == 4 and worker.min_succeeded_task_count == 2 and worker.min_failed_task_count == 1
    assert [p.label for p in worker.ports] == ["http", "ssh"]
    assert spec.job_envs == {"batch_size": 32, "job_model": "resnet20"}
    assert spec.total_tasks == 4 and spec.total_gpus == 8


def test_it_keeps_fields_seen_in_the_examples_and_warns_about_none_of_them():
    parsed = parse((EXAMPLES / "helloworld-nvidia-smi.json").read_text())
    assert parsed.warnings == []
    assert parsed.normalized["tmp"]["vgInfo"]["名称"] == "test"
    assert parsed.normalized["taskRoles"][0]["storageGB"] == 5
    assert parsed.spec.role("task_1").min_failed_task_count is None  # explicit null: failures never fail the job


def test_it_applies_defaults():
    spec = parse(good()).spec
    role = spec.task_roles[0]
    assert role.shm_mb == 64 and role.min_failed_task_count == 1 and role.min_succeeded_task_count is None
    assert spec.virtual_cluster == "default" and spec.retry_count == 0 and spec.gpu_type is None
    assert spec.output_dir == f"{FS}/Output/alice/ok-job"


def test_it_substitutes_platform_variables_in_folders_only():
    value = good()
    value.update(codeDir="$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/code", outputDir="${PAI_DEFAULT_FS_URI}/out/$PAI_JOB_NAME",
                 dataDir="$PAI_JOB_NAME_NOT_A_VAR")
    value["taskRoles"][0]["command"] = "echo $PAI_JOB_NAME"
    spec = parse(value).spec
    assert spec.code_dir == f"{FS}/alice/code"
    assert spec.output_dir == f"{FS}/out/ok-job"
    assert spec.data_dir == "$PAI_JOB_NAME_NOT_A_VAR"
    assert spec.task_roles[0].command == "echo $PAI_JOB_NAME"
    assert substitute("$PAI_USER_NAME", job_name="j", user_name="u", default_fs_uri="f") == "u"


def test_it_stores_the_config_exactly_as_submitted():
    text = (EXAMPLES / "distributed-tensorflow-early.jsonc").read_text()
    parsed = parse(text)
    assert parsed.raw == text and "// use 2 ps servers" in parsed.raw


def test_it_round_trips_the_normalized_config():
    parsed = parse((EXAMPLES / "jupyter-notebook.json").read_text())
    again = parse(json.dumps(parsed.normalized))
    assert again.normalized == parsed.normalized
    assert again.spec == parsed.spec


def test_it_warns_about_a_typo_and_reports_the_missing_field():
    value = good()
    role = value["taskRoles"][0]
    role["cpuNumbr"] = role.pop("cpuNumber")
    with pytest.raises(SpecError) as caught:
        parse(value)
    assert [(p.path, p.message) for p in caught.value.problems] == [
        ("taskRoles[0].cpuNumber", "is required: a whole number of at least 1")
    ]
    warning = caught.value.warnings[0]
    assert warning.path == "taskRoles[0].cpuNumbr" and 'did you mean "cpuNumber"?' in warning.message


def test_it_keeps_unknown_fields_with_a_warning():
    value = good()
    value["myNote"] = {"a": 1}
    parsed = parse(value)
    assert parsed.normalized["myNote"] == {"a": 1}
    assert "unknown field \"myNote\"" in parsed.warnings[0].message


def test_it_warns_about_what_is_valid_but_cannot_take_effect():
    # OpenPAI's schema takes these; each is kept, and the user is told why
    # it will not do what it seems to.
    value = good()
    value["killAllOnCompletedTaskNumber"] = 9
    value["jobEnvs"] = {"paiAzRDMA": True, "NVIDIA_VISIBLE_DEVICES": "all", "isDebug": False}
    parsed = parse(value)
    assert parsed.spec.kill_all_on_completed_task_number == 9
    assert parsed.spec.job_envs == value["jobEnvs"]
    warnings = {w.path: w.message for w in parsed.warnings}
    assert set(warnings) == {"killAllOnCompletedTaskNumber", "jobEnvs.paiAzRDMA", "jobEnvs.NVIDIA_VISIBLE_DEVICES"}
    assert "only 2 tasks" in warnings["killAllOnCompletedTaskNumber"]
    assert "Azure RDMA" in warnings["jobEnvs.paiAzRDMA"]
    assert "set by the platform" in warnings["jobEnvs.NVIDIA_VISIBLE_DEVICES"]
    value["killAllOnCompletedTaskNumber"] = 2
    value["jobEnvs"] = {"paiAzRDMA": False}
    assert parse(value).warnings == []


def test_it_refuses_what_only_a_v2_configs_stored_form_holds():
    # Kept as unknown fields, these would take effect once the job is stored
    # (JobSpec.from_config reads them): a v1 job runs the job's one image.
    value = good()
    value["imageAuth"] = {"registry": "r.example", "username": "u", "password": "p"}
    value["taskRoles"][0]["roleImage"] = "debian"
    assert [found.split(":")[0] for found in problems(value)] == ["taskRoles[0].roleImage", "imageAuth"]
    assert "every task role runs the job's \"image\"" in problems(value)[0]


def test_it_reports_syntax_errors_at_their_line_and_column():
    text = '{\n  "jobName": "x",\n  "image": "y"\n  "taskRoles": []\n}'
    assert problems(text) == ['config: invalid JSON: expected "," or "}" after a value in an object (line 4, column 3)']


def test_it_points_schema_errors_at_their_place_in_the_text():
    text = '{\n  "jobName": "x",\n  "image": "y",\n  "taskRoles": [\n    {"name": "a", "taskNumber": 1, "cpuNumber": 1,\n     "memoryMB": 5, "gpuNumber": 0, "command": "c"}\n  ]\n}'
    with pytest.raises(SpecError) as caught:
        parse(text)
    problem = caught.value.problems[0]
    assert (problem.path, problem.line, problem.column) == ("taskRoles[0].memoryMB", 6, 18)


def test_it_reports_every_problem_at_once():
    value = good()
    value["jobName"] = "bad name"
    value["retryCount"] = -1
    value["taskRoles"][0].update(memoryMB=1, gpuNumber="two")
    assert len(problems(value)) == 4


def _with(path: str, value):
    """good() with one field set (None deletes it); path like taskRoles.0.cpuNumber."""
    config = good()
    target = config
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return config


_DELETE = object()
ROLE = "taskRoles.0."
BAD_INPUTS = [
    # (config, the path and message expected in the first problem)
    (_with("jobName", _DELETE), "jobName: is required"),
    (_with("jobName", ""), "jobName: must not be empty"),
    (_with("jobName", "has space"), 'jobName: expected letters, digits and - . _ ~'),
    (_with("jobName", "x" * 200), "jobName: expected at most 128 characters"),
    (_with("jobName", 42), "jobName: expected a string, got the number 42"),
    (_with("image", _DELETE), "image: is required"),
    (_with("image", "two words"), "image: expected a Docker image name without spaces"),
    (_with("image", ["busybox"]), "image: expected a string, got a list"),
    (_with("virtualCluster", "no-dash"), "virtualCluster: expected letters, digits and _"),
    (_with("retryCount", -1), "retryCount: expected at least 0, got -1"),
    (_with("retryCount", 1.5), "retryCount: expected a whole number, got the number 1.5"),
    (_with("retryCount", True), "retryCount: expected a whole number, got true"),
    (_with("taskRoles", _DELETE), "taskRoles: is required: a list with at least one task role"),
    (_with("taskRoles", []), "taskRoles: expected at least one task role"),
    (_with("taskRoles", {"name": "a"}), "taskRoles: expected a list of task roles, got an object"),
    (_with("taskRoles", ["main"]), "taskRoles[0]: expected a task role object"),
    (_with(ROLE + "name", "bad/name"), "taskRoles[0].name: expected letters, digits and . _ ~"),
    (_with(ROLE + "taskNumber", 0), "taskRoles[0].taskNumber: expected at least 1, got 0"),
    (_with(ROLE + "taskNumber", 5000), "taskRoles[0].taskNumber: expected at most 1000, got 5000"),
    (_with(ROLE + "cpuNumber", 0), "taskRoles[0].cpuNumber: expected at least 1, got 0"),
    (_with(ROLE + "cpuNumber", "4"), 'taskRoles[0].cpuNumber: expected a whole number, got the string "4"'),
    (_with(ROLE + "memoryMB", 99), "taskRoles[0].memoryMB: expected at least 100 MB, got 99"),
    (_with(ROLE + "memoryMB", 10**30), "taskRoles[0].memoryMB: expected at most"),
    (_with(ROLE + "shmMB", 1024), "taskRoles[0].shmMB: expected at most memoryMB (512), got 1024"),
    (_with(ROLE + "gpuNumber", -1), "taskRoles[0].gpuNumber: expected at least 0, got -1"),
    (_with(ROLE + "gpuNumber", None), "taskRoles[0].gpuNumber: expected a whole number, got null"),
    (_with(ROLE + "command", ""), "taskRoles[0].command: must not be empty"),
    (_with(ROLE + "command", _DELETE), "taskRoles[0].command: is required"),
    (_with(ROLE + "minFailedTaskCount", 3), "taskRoles[0].minFailedTaskCount: expected null or between 1 and taskNumber (2), got 3"),
    (_with(ROLE + "minSucceededTaskCount", 0), "taskRoles[0].minSucceededTaskCount: expected at least 1, got 0"),
    (_with(ROLE + "portList", {"label": "x"}), "taskRoles[0].portList: expected a list of {label, beginAt, portNumber}"),
    (_with(ROLE + "portList", [{"label": "a b", "beginAt": 0, "portNumber": 1}]), "taskRoles[0].portList[0].label: expected letters"),
    (_with(ROLE + "portList", [{"label": "http", "beginAt": 0, "portNumber": 0}]), "taskRoles[0].portList[0].portNumber: expected at least 1, got 0"),
    (_with(ROLE + "portList", [{"label": "http", "beginAt": 65535, "portNumber": 2}]), "taskRoles[0].portList[0].beginAt: ports 65535..65536 go past 65535"),
    (_with(ROLE + "portList", [{"label": "p", "beginAt": 0, "portNumber": 1}, {"label": "p", "beginAt": 0, "portNumber": 1}]),
     'taskRoles[0].portList[1].label: duplicate port label "p"'),
    (_with("jobEnvs", [1]), "jobEnvs: expected an object of name: value pairs, got a list"),
    (_with("jobEnvs", {"isDebug": "yes"}), 'jobEnvs.isDebug: expected true or false, got the string "yes"'),
    (_with("jobEnvs", {"paiAzRDMA": 1}), "jobEnvs.paiAzRDMA: expected true or false, got the number 1"),
    (_with("jobEnvs", {"nested": {"a": 1}}), "jobEnvs.nested: expected a string, number, boolean or null, got an object"),
    (_with("jobEnvs", {"1abc": "x"}), "jobEnvs.1abc: expected an environment variable name"),
    (_with("jobEnvs", {"PAI_JOB_NAME": "x"}), "jobEnvs.PAI_JOB_NAME: names starting with PAI_ are set by the platform"),
    (_with("extras", "text"), 'extras: expected an object, got the string "text"'),
    (_with("extras", {"uploadOutputs": "yes"}), 'extras.uploadOutputs: expected true or false, got the string "yes"'),
    (_with("killAllOnCompletedTaskNumber", -1), "killAllOnCompletedTaskNumber: expected at least 0, got -1"),
    (_with("gpuType", "V 100"), "gpuType: expected a GPU type name like V100"),
    ([1, 2], "config: expected a JSON object {...} holding jobName, image and taskRoles, got a list"),
    ("", "config: the config is empty"),
    ("{", "config: invalid JSON: unexpected end of input"),
    ('{"jobName": "a", "jobName": "b"}', 'config: invalid JSON: duplicate key "jobName" (line 1, column 18)'),
    ('{"jobName": "a",}', 'config: invalid JSON: trailing comma before "}"'),
    ("{/* never closed", "config: invalid JSON: comment opened with /* is never closed"),
    ('{"jobName": NaN}', "config: invalid JSON: unexpected text 'NaN}'"),
    ('{"jobName": 1e999}', "config: invalid JSON: number is too large"),
    ('{"jobName": "\\ud800"}', "config: invalid JSON: string holds half of a unicode surrogate pair"),
    ('{"jobName": "a\\u0000b"}', "config: invalid JSON: strings may not contain the NUL character"),
    ("[" * 100 + "]" * 100, "config: invalid JSON: nested deeper than 32 levels"),
    ('{"a": ' * 40 + "1" + "}" * 40, "config: invalid JSON: nested deeper than 32 levels"),
    ("x" * (MAX_CONFIG_BYTES + 1), "config: the config is 256 KB; the limit is 256 KB"),
    (b"\xff\xfe{}", "config: the file is not UTF-8 text"),
    ("protocolVersion: 2\nname: x\n", "config: this looks like an OpenPAI v2 YAML config"),
]


def _duplicate_roles() -> dict:
    config = good()
    config["taskRoles"].append(copy.deepcopy(config["taskRoles"][0]))
    return config


BAD_INPUTS.append((_duplicate_roles(), 'taskRoles[1].name: duplicate task role name "main" (also taskRoles[0].name)'))


@pytest.mark.parametrize("value,expected", BAD_INPUTS, ids=[e[1][:60] for e in BAD_INPUTS])
def test_it_names_the_field_and_what_was_expected(value, expected):
    found = problems(value)
    assert any(problem.startswith(expected) for problem in found), found


def test_the_bad_input_table_is_big_enough():
    assert len(BAD_INPUTS) >= 30


# Values of every JSON shape, and JSON-ish text, for the property tests.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)
keys = st.sampled_from(["jobName", "image", "taskRoles", "name", "taskNumber", "cpuNumber", "memoryMB", "gpuNumber",
                        "command", "portList", "label", "beginAt", "portNumber", "jobEnvs", "extras", "retryCount",
                        "shmMB", "minFailedTaskCount", "minSucceededTaskCount", "isDebug", "virtualCluster"])
config_like = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10, max_value=10**6) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=8),
    max_leaves=40,
)


def _only_spec_errors(data) -> None:
    try:
        parse_job_config(data, user_name="alice", default_fs_uri=FS)
    except SpecError as exc:
        assert exc.problems and all(p.message for p in exc.problems)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_no_text_or_bytes_raise_anything_but_a_spec_error(data):
    _only_spec_errors(data)


@settings(max_examples=400, deadline=None)
@given(json_values | config_like)
def test_no_json_value_raises_anything_but_a_spec_error(value):
    _only_spec_errors(json.dumps(value))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(EXAMPLES.iterdir())), st.data())
def test_no_mangled_example_raises_anything_but_a_spec_error(path, data):
    text = path.read_text()
    start = data.draw(st.integers(min_value=0, max_value=len(text)))
    end = data.draw(st.integers(min_value=start, max_value=min(len(text), start + 20)))
    insert = data.draw(st.text(alphabet='{}[]",:/*0123456789 \n-truefalsn\\', max_size=10))
    _only_spec_errors(text[:start] + insert + text[end:])


# ------------------------------------------------- the stored config and back

def _stored(spec: JobSpec) -> dict:
    """What a job row holds: to_config(), through JSON as the database keeps it."""
    return json.loads(json.dumps(spec.to_config(), ensure_ascii=False))


@pytest.mark.parametrize("path", sorted(EXAMPLES.iterdir()), ids=lambda p: p.name)
def test_it_reads_every_examples_stored_config_back_into_the_same_spec(path):
    try:
        spec = parse(path.read_text()).spec
    except SpecError:
        pytest.skip(f"{path.name} does not parse")
    assert JobSpec.from_config(_stored(spec)) == spec


def _every_field() -> dict:
    return {
        "jobName": "all-fields",
        "image": "pai/tf:1.12",
        "authFile": "$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/auth.txt",
        "dataDir": "$PAI_DEFAULT_FS_URI/data",
        "outputDir": "$PAI_DEFAULT_FS_URI/out/$PAI_JOB_NAME",
        "codeDir": "$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/code",
        "virtualCluster": "vc_a",
        "gpuType": "V100",
        "retryCount": 2,
        "killAllOnCompletedTaskNumber": 3,
        "jobEnvs": {"isDebug": True, "paiAzRDMA": False, "BATCH": 32, "RATE": 0.5, "MODEL": "resnet", "EMPTY": None},
        "extras": {"uploadOutputs": True, "nested": {"list": [1, "two", None]}},
        "tmp": {"vgInfo": {"名称": "test"}},
        "myNote": ["kept", {"as": "is"}],
        "taskRoles": [
            {"name": "ps", "taskNumber": 1, "cpuNumber": 2, "memoryMB": 2048, "shmMB": 128, "gpuNumber": 0,
             "command": "python ps.py --out $PAI_OUTPUT_DIR", "minFailedTaskCount": None,
             "portList": [{"label": "http", "beginAt": 0, "portNumber": 2}, {"label": "grpc", "beginAt": 9000, "portNumber": 1}],
             "storageGB": 5, "roleNote": {"why": "kept"}},
            {"name": "worker", "taskNumber": 3, "cpuNumber": 4, "memoryMB": 8192, "gpuNumber": 1,
             "command": "python worker.py", "minFailedTaskCount": 2, "minSucceededTaskCount": 2},
        ],
    }


def test_it_reads_a_stored_config_with_every_field_back_into_the_same_spec():
    parsed = parse(_every_field())
    spec = parsed.spec
    # Each kind of field is there to be lost: the round trip below is no easy pass.
    assert spec.task_roles[0].ports[1].begin_at == 9000 and spec.task_roles[0].min_failed_task_count is None
    assert spec.kill_all_on_completed_task_number == 3 and spec.kept.keys() == {"tmp", "myNote"}
    assert spec.task_roles[0].extra == {"storageGB": 5, "roleNote": {"why": "kept"}}
    assert spec.job_envs["isDebug"] is True and spec.extras["nested"] == {"list": [1, "two", None]}
    stored = _stored(spec)
    again = JobSpec.from_config(stored)
    assert again == spec
    # And on to the same stored config, key order included: the job page and
    # its "normalized" download print to_config() of the spec read back.
    assert json.dumps(again.to_config(), ensure_ascii=False) == json.dumps(stored, ensure_ascii=False)


def test_it_reads_back_what_the_defaults_left_out():
    spec = parse(good()).spec
    again = JobSpec.from_config(_stored(spec))
    assert again == spec
    assert again.kill_all_on_completed_task_number is None and again.gpu_type is None and again.code_dir is None
    assert again.task_roles[0].min_failed_task_count == 1 and again.task_roles[0].shm_mb == 64


@pytest.mark.parametrize("key", ["taskRoles[" + "9" * 5000 + "]", "portList[" + "9" * 30 + "].label"])
def test_a_key_spelled_like_a_huge_index_is_only_an_unknown_field(key):
    """The unknown field's warning looks its place up by path; int() of more
    than 4,300 digits used to escape the parser as a ValueError."""
    value = good()
    value[key] = 1
    parsed = parse(value)
    assert [w.path for w in parsed.warnings if key in w.path] == [key]


def test_it_keeps_a_port_entrys_unknown_fields_as_its_warning_says():
    value = good()
    value["taskRoles"][0]["portList"] = [{"label": "a", "beginAt": 0, "portNumber": 1, "protocol": "tcp"}]
    parsed = parse(value)
    assert any(w.path.endswith("portList[0].protocol") and "is kept in the stored config" in w.message
               for w in parsed.warnings)
    assert parsed.normalized["taskRoles"][0]["portList"][0] == {"label": "a", "beginAt": 0, "portNumber": 1,
                                                                 "protocol": "tcp"}
    assert JobSpec.from_config(parsed.normalized) == parsed.spec


def test_folders_take_pai_username_as_openpais_rest_server_did():
    value = good()
    value["outputDir"] = "$PAI_DEFAULT_FS_URI/$PAI_USERNAME/out"
    value["codeDir"] = "${PAI_USERNAME}/code"
    spec = parse(value).spec
    assert (spec.output_dir, spec.code_dir) == (f"{FS}/alice/out", "alice/code")


def test_kill_all_past_the_tasks_is_taken_with_a_warning_however_large():
    value = good()
    value["killAllOnCompletedTaskNumber"] = 5000
    parsed = parse(value)
    assert parsed.spec.kill_all_on_completed_task_number == 5000
    assert [w.path for w in parsed.warnings] == ["killAllOnCompletedTaskNumber"]


@pytest.mark.parametrize("name", [".", "..", "..."])
def test_it_refuses_job_and_task_role_names_of_dots_only(name):
    """OpenPAI's patterns take them, but every HTTP client folds such a path
    segment away (GET .../jobs/. is GET .../jobs), and a job named "." got
    its owner's whole Output/<user> folder as its outputDir."""
    assert any(p.startswith("jobName") and "not dots only" in p for p in problems({**good(), "jobName": name}))
    role = {**good()["taskRoles"][0], "name": name}
    assert any(p.startswith("taskRoles[0].name") and "not dots only" in p
               for p in problems({**good(), "taskRoles": [role]}))
    assert parse({**good(), "jobName": f"{name}a."}).spec.job_name == f"{name}a."


def test_it_refuses_fixed_ports_of_one_role_that_overlap():
    """8080 x2 and 8081 in one role: accepted, then never placed anywhere."""
    role = {**good()["taskRoles"][0], "portList": [{"label": "a", "beginAt": 8080, "portNumber": 2},
                                                    {"label": "b", "beginAt": 8081, "portNumber": 1},
                                                    {"label": "c", "beginAt": 0, "portNumber": 5}]}
    found = problems({**good(), "taskRoles": [role]})
    assert any(p.startswith("taskRoles[0].portList") and 'ports 8081..8081 of label "b" overlap 8080..8081' in p
               for p in found), found
    role["portList"][1]["beginAt"] = 8082
    assert [p.label for p in parse({**good(), "taskRoles": [role]}).spec.task_roles[0].ports] == ["a", "b", "c"]
