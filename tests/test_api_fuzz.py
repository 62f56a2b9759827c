"""Schema-driven fuzzing: schemathesis reads the portal's own OpenAPI
description and throws valid and invalid requests at every operation of the
live test portal. No request may get a 500, and every answer must match
the description (status, content type, shape, headers), refuse missing
auth and refuse data that breaks the schema.

The run is bounded (a fixed number of examples per operation, a time cap)
and reproducible (a fixed seed). Path parameters are sometimes pointed at a
real job of the fuzzing user, so the job endpoints are exercised beyond
"not found"; every job it submits lands in a virtual cluster with no share
of the cluster, so nothing fuzzed ever starts a container.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from jobs.models import User
from jobs.services import ratelimit
from tests.cluster import process_env
from tests.helpers import hold_vc

pytestmark = pytest.mark.services

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance",
    "response_headers_conformance", "negative_data_rejection", "ignored_auth", "unsupported_method",
])

# Loaded by the schemathesis process (SCHEMATHESIS_HOOKS); it is not a test.
HOOKS = '''
import os

import schemathesis
from hypothesis import strategies as st

ME, JOB, VC = os.environ["FUZZ_USER"], os.environ["FUZZ_JOB"], os.environ["FUZZ_VC"]
ADMIN = os.environ.get("FUZZ_ADMIN") == "1"
REAL = {"username": ME, "name": JOB, "role": "main", "index": 0}


def _own(name):
    # schemathesis reuses values seen in answers (GET /user lists everyone):
    # an admin run must never create, change or remove anyone but its own.
    return "fz" + name[:40] if isinstance(name, str) else name


@schemathesis.hook
def flatmap_path_parameters(context, path_parameters):
    if not path_parameters:
        return st.just(path_parameters)
    mine = {key: REAL.get(key, value) for key, value in path_parameters.items()}
    return st.sampled_from([path_parameters, mine])


@schemathesis.hook
def map_case(context, case):
    # Jobs go to the virtual cluster with no share; a PUT names its job by
    # the path, so the body's name follows it (schemathesis re-checks
    # whether an edited case still breaks the schema).
    if isinstance(case.body, dict) and "taskRoles" in case.body:
        case.body = {**case.body, "virtualCluster": VC}
        name = (case.path_parameters or {}).get("name")
        if case.method.upper() == "PUT" and isinstance(name, str):
            case.body["jobName"] = name
    if ADMIN:
        if case.path_parameters and "username" in case.path_parameters:
            case.path_parameters = {**case.path_parameters, "username": ME}
        if isinstance(case.body, dict) and "username" in case.body:
            case.body = {**case.body, "username": _own(case.body["username"])}
        if case.query and "username" in case.query:
            case.query = {**case.query, "username": _own(case.query["username"])}
    return case
'''


def _token(base_url: str, user) -> str:
    response = requests.post(f"{base_url}/api/v1/token", json={"username": user.username, "password": user.test_password},
                             timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["token"]


def _fuzz(base_url: str, token: str, tmp_path: Path, env: dict[str, str], *, examples: int, seconds: int,
          include: str = "") -> None:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "api_fuzz_hooks.py").write_text(HOOKS)
    command = [
        str(Path(sys.executable).with_name("schemathesis")), "run", f"{base_url}/api/v1/openapi.json",
        "--checks", CHECKS, "--max-examples", str(examples), "--seed", "20240601", "--workers", "2",
        "--phases", "examples,fuzzing", "--max-time", str(seconds), "--request-timeout", "30",
        "--header", f"Authorization: Bearer {token}", "--suppress-health-check", "all", "--no-color",
    ]
    if include:
        command += ["--include-path-regex", include]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 120, cwd=tmp_path,
        env={**process_env(), **env, "PYTHONPATH": str(tmp_path), "SCHEMATHESIS_HOOKS": "api_fuzz_hooks"},
    )
    output = result.stdout + result.stderr
    print(output[-3000:])
    assert result.returncode == 0, output[-8000:]


def test_fuzzing_the_api_finds_no_500_and_no_departure_from_its_description(cluster, make_user, tmp_path):
    user = make_user("fuzz")
    vc = hold_vc(f"hold_{user.username}", user)
    token = _token(cluster.base_url, user)
    job = {"jobName": "fuzzjob", "image": "pai-local/busybox:latest", "virtualCluster": vc.name,
           "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128, "gpuNumber": 0,
                          "command": "true"}]}
    submitted = requests.post(f"{cluster.base_url}/api/v1/user/{user.username}/jobs", data=json.dumps(job),
                              headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert submitted.status_code == 202, submitted.text
    env = {"FUZZ_USER": user.username, "FUZZ_JOB": "fuzzjob", "FUZZ_VC": vc.name}
    try:
        _fuzz(cluster.base_url, token, tmp_path / "user", env, examples=15, seconds=45)
        # The admin-only operations once more, as an admin; everyone else's
        # account must come out of it untouched.
        admin = make_user("fuzzadmin", admin=True)
        others = dict(User.objects.exclude(pk__in=[user.pk, admin.pk]).values_list("username", "password"))
        _fuzz(cluster.base_url, _token(cluster.base_url, admin), tmp_path / "admin", {**env, "FUZZ_ADMIN": "1"},
              examples=30, seconds=15,
              include=r"^/user(/\{username\}/virtualClusters)?$")
        after = dict(User.objects.filter(username__in=others).values_list("username", "password"))
        assert after == others
    finally:
        # Fuzzed logins count against this machine's address; later tests log in too.
        ratelimit.login_reset(address="127.0.0.1")
