"""The v2 API's OpenAPI 3.0 description, served at /api/v2/openapi.json.

v2 paths are relative to /api/v2 (v1's to /api/v1), so they are described
apart, with v1's building blocks and schemas (jobs/api/openapi.py).
tests/test_api_v2.py checks that every v2 route is described.
"""

from __future__ import annotations

from jobs.api import openapi_nodes
from jobs.api.openapi import (
    BOOLEAN, INTEGER, STRING, Schema, _schemas, answer, attempt_paths, body, errors, obj, operation, path_param,
    query_param, ref, token_path, virtual_cluster_paths,
)

JOB_PARAMS = [path_param("username", "the job owner's username"), path_param("name", "the job's name")]
TAG_BODY = obj({"value": {"type": "string", "minLength": 1, "maxLength": 64}}, ["value"])


def _list_parameters() -> list[Schema]:
    comma = "comma-separated: any of them"
    return [
        query_param("username", f"owners ({comma})", STRING),
        query_param("vc", f"virtual clusters ({comma})", STRING),
        query_param("state", f"job states ({comma}; OpenPAI's UNKNOWN matches no job)", STRING),
        query_param("keyword", "in the job's name, owner or virtual cluster", STRING),
        query_param("tagsContain", f"jobs with any of these tags ({comma})", STRING),
        query_param("tagsNotContain", f"jobs with none of these tags ({comma})", STRING),
        query_param("offset", "jobs to skip", {"type": "integer", "minimum": 0}),
        query_param("limit", "page size (default and most: 1000)", {"type": "integer", "minimum": 1, "maximum": 1000}),
        query_param("order", "<field>[,ASC|DESC]: jobName, username, vc, state, submissionTime (default, DESC), "
                             "completionTime, retries, totalGpuNumber, totalTaskNumber; any other value is the default, as "
                             "OpenPAI ignores it", STRING),
        query_param("withTotalCount", "true: answer {totalCount, data}", {"type": "string", "enum": ["true", "false"]}),
    ]


def _v2_schemas() -> dict[str, Schema]:
    summary = {"allOf": [ref("JobSummary"), obj({
        "tags": {"type": "array", "items": STRING}, "submissionTime": INTEGER,
        "launchedTime": {**INTEGER, "nullable": True}})]}
    return {
        "JobSummaryV2": summary,
        "JobStatusV2": {"allOf": [ref("JobStatus"), obj({
            "protocolVersion": {"type": "integer", "enum": [1, 2]}, "tags": {"type": "array", "items": STRING},
            "jobAttempts": {"type": "array", "items": ref("JobAttempt"),
                            "description": "The newest 10 job attempts; every one at .../job-attempts."},
            "jobAttemptCount": INTEGER})]},
        "ProtocolV2": {"type": "object", "additionalProperties": True, "required": ["protocolVersion", "name",
                                                                                   "type", "taskRoles"],
                       "description": "OpenPAI protocol v2 (github.com/microsoft/openpai-protocol, "
                                      "schemas/v2/schema.yaml), as YAML or JSON."},
        "SkuType": obj({"cpu": INTEGER, "memory": INTEGER, "gpu": INTEGER}, ["cpu", "memory", "gpu"]),
        "Tag": TAG_BODY,
        "UsageSpread": obj({"mean": {"type": "number"}, "min": {"type": "number"}, "max": {"type": "number"}},
                           ["mean", "min", "max"], description="over the tasks (GPUs) sampled in a bucket: the "
                                                               "mean, the least and the most busy"),
        "UserV2": obj({"username": STRING, "admin": BOOLEAN, "active": BOOLEAN,
                       "virtualCluster": {"type": "array", "items": STRING,
                                          "description": "every virtual cluster the user may submit to, default "
                                                         "first"}},
                      ["username", "admin", "virtualCluster"]),
    }


def _paths() -> dict[str, Schema]:
    message = ref("Message")
    listed = {"type": "array", "items": ref("JobSummaryV2")}
    return {
        "/openapi.json": {"get": operation("Get the v2 description", answer(
            200, "This description.", {"type": "object", "additionalProperties": True}), public=True, tag="api")},
        "/authn/basic/login": token_path("Log in"),
        "/jobs": {
            "get": operation("List jobs (v2)", {**answer(200, "Your jobs (an admin: everyone's); with "
                                                              "withTotalCount=true, {totalCount, data}.",
                                                         {"oneOf": [listed, obj({"totalCount": INTEGER,
                                                                                 "data": listed})]}),
                                                **errors(400, 401)}, parameters=_list_parameters(), tag="jobs"),
            "post": operation("Submit a job (v2)", {
                **answer(202, "Accepted: the job waits for the scheduler.",
                         obj({"status": {"type": "integer", "enum": [202]}, "message": STRING}, ["message"]),
                         {"Location": {"description": "the job's v2 status URL", "schema": STRING}}),
                **errors(400, 401, 403, 404, 409, 413, 429)},
                request_body={"required": True, "content": {
                    "text/yaml": {"schema": ref("ProtocolV2")}, "application/json": {"schema": ref("ProtocolV2")}}},
                tag="jobs", description="A protocol v2 config (a v1 JSON config is taken too). Every problem is "
                "listed in `problems` with its path, line and column. Secrets never come back: the stored config "
                "masks them."),
        },
        "/jobs/{username}~{name}": {"parameters": JOB_PARAMS, "get": operation(
            "Get a job's status (v2)", {**answer(200, "v1's status plus protocolVersion, tags and every attempt.",
                                                 ref("JobStatusV2")), **errors(401, 404)}, tag="jobs")},
        "/jobs/{username}~{name}/attempts/{attempt_id}": {
            "parameters": [*JOB_PARAMS, path_param("attempt_id", "OpenPAI's jobAttemptId: 0 is the first attempt, "
                                                                 "as jobStatus.retries counts",
                                                   {"type": "integer", "minimum": 0})],
            "get": operation("Get a job's status at one of its attempts", {
                **answer(200, "The job's status with that attempt's app* fields and task containers (the job's "
                              "own state, retries and times stay the job's).", ref("JobStatusV2")),
                **errors(400, 401, 404)}, tag="jobs")},
        "/jobs/{username}~{name}/config": {"parameters": JOB_PARAMS, "get": operation(
            "Get a job's config (v2)", {
                "200": {"description": "The config as submitted: YAML for a v2 job (secrets masked), JSON for v1.",
                        "content": {"text/yaml": {"schema": STRING},
                                    "application/json": {"schema": {"type": "object", "additionalProperties": True}}}},
                **errors(401, 404)}, tag="jobs")},
        "/jobs/{username}~{name}/executionType": {"parameters": JOB_PARAMS, "put": operation(
            "Stop a job (v2)", {**answer(202, "Stopping (or already ended).", message), **errors(400, 401, 404, 413)},
            request_body=body(ref("ExecutionType")), tag="jobs")},
        "/jobs/{username}~{name}/tag": {
            "parameters": JOB_PARAMS,
            "put": operation("Add a tag", {**answer(200, "Added (or already there).", message),
                                           **errors(400, 401, 404, 413)}, request_body=body(ref("Tag")), tag="jobs"),
            "delete": operation("Remove a tag", {**answer(200, "Removed (or not there).", message),
                                                 **errors(400, 401, 404, 413)}, request_body=body(ref("Tag")),
                                tag="jobs"),
        },
        "/jobs/{username}~{name}/ssh": {"parameters": JOB_PARAMS, "get": operation(
            "Get a job's SSH info (v2)", {**answer(200, "As in v1.", ref("SshInfo")), **errors(401, 404)},
            tag="access")},
        "/jobs/{username}~{name}/ssh/key": {"parameters": JOB_PARAMS, "get": operation(
            "Download a job's private key (v2)", {
                "200": {"description": "As in v1.", "content": {"application/x-pem-file": {"schema": STRING}}},
                **errors(401, 404)}, tag="access")},
        "/jobs/{username}~{name}/tasks/{role}/{index}/log": {
            "parameters": [*JOB_PARAMS, path_param("role", "the task role"),
                           path_param("index", "the task's index", {"type": "integer", "minimum": 0})],
            "get": operation("Read a task's log (v2)", {**answer(200, "As in v1.", ref("LogPage")),
                                                        **errors(400, 401, 404)}, tag="access")},
        "/jobs/{username}~{name}/tasks/{role}/{index}/metrics": {
            "parameters": [*JOB_PARAMS, path_param("role", "the task role"),
                           path_param("index", "the task's index", {"type": "integer", "minimum": 0})],
            "get": operation("Read a task's usage samples (v2)", {**answer(200, "As in v1.", ref("TaskUsage")),
                                                                  **errors(400, 401, 404)}, tag="access")},
        "/jobs/{username}~{name}/metrics": {"parameters": JOB_PARAMS, "get": operation(
            "Read the usage samples of a job's tasks", {**answer(200, "Each task of the attempt with its samples.", obj({
                "job": STRING, "state": STRING, "attempt": INTEGER, "sampleSeconds": {"type": "number"},
                "samplesPerTask": INTEGER,
                "tasks": {"type": "array", "items": obj({
                    "taskRole": STRING, "taskIndex": INTEGER, "attempt": INTEGER, "state": STRING, "node": STRING,
                    "gpus": {"type": "array", "items": INTEGER}, "gpusSimulated": {"type": "boolean"},
                    "idleGpus": {"type": "boolean"}, "samples": {"type": "array", "items": ref("UsageSample")},
                })},
            })), **errors(400, 401, 404)}, tag="access", parameters=[
                query_param("since", "only samples after this ISO-8601 time", STRING),
                query_param("attempt", "the job attempt (default: the current one)", {"type": "integer", "minimum": 1}),
            ], description="The job's owner and admins only; the job page's graphs of a job of up to 8 tasks read "
                           "this. A bigger job's page reads .../metrics/summary and its picked task's own metrics.")},
        "/jobs/{username}~{name}/metrics/summary": {"parameters": JOB_PARAMS, "get": operation(
            "Read a job's usage added up over its tasks", {**answer(200, "The attempt's tasks per time bucket.", obj({
                "job": STRING, "state": STRING, "attempt": INTEGER, "taskCount": INTEGER,
                "sampleSeconds": {"type": "number"}, "window": INTEGER, "maxWindow": INTEGER, "bucketSeconds": INTEGER,
                "from": STRING, "until": STRING,
                "buckets": {"type": "array", "items": obj({
                    "time": STRING, "tasks": INTEGER, "cpuCores": {"type": "number"},
                    "cpuPercent": ref("UsageSpread"), "memoryBytes": INTEGER, "gpus": INTEGER,
                    "gpuPercent": {"allOf": [ref("UsageSpread")], "nullable": True},
                })},
            })), **errors(400, 401, 404)}, tag="access", parameters=[
                query_param("window", "seconds back from now (default 3600, at least 60, at most `maxWindow`: "
                                      "USAGE_MINUTES_DAYS, whatever the task count)",
                            {"type": "integer", "minimum": 60}),
                query_param("since", "only buckets starting after this ISO-8601 time (a poll passes the newest "
                                     "bucket's `time`)", STRING),
                query_param("attempt", "the job attempt (default: the current one)", {"type": "integer", "minimum": 1}),
            ], description="The job's owner and admins only; the job page's job-wide graphs read this. Buckets are "
                           "`bucketSeconds` wide (at most 360 of them in a window; 10 s for an hour at the default 5 s "
                           "sample interval when the window's samples are within USAGE_SUMMARY_MAX_SAMPLES, a minute "
                           "past it), aligned to the epoch; only whole buckets are given (from `from` to `until`), "
                           "and buckets no task was sampled in are left out. In a bucket under a minute each task "
                           "counts once, as the mean of its samples there (each GPU likewise): `tasks` sampled, "
                           "`cpuCores` (cpuPercent / 100) and `memoryBytes` summed over them, `cpuPercent` per task "
                           "and `gpuPercent` per GPU as mean, least and most busy (null without GPU figures). A "
                           "bucket of a minute is the same; a wider one adds its whole minutes up, each computed so: "
                           "`tasks` and `gpus` the most in one minute, `cpuCores` and `memoryBytes` the mean of the "
                           "minutes' sums, the means over every task (GPU) minute, least and most busy in any one "
                           "minute. Whole minutes come from a per-job roll-up; a sample stored late is counted once "
                           "its minute is rolled up again, within about a minute (at once if it is among the newest "
                           "minutes the summary reads raw).")},
        **attempt_paths(),
        **virtual_cluster_paths(),
        "/cluster/sku-types": {"get": operation("List SKU types", {
            **answer(200, "Each GPU type on the ready nodes by name: one GPU of it with the CPUs and memory (MB) "
                          "it comes with on the smallest node that has it, as OpenPAI's resource units.",
                     {"type": "object", "additionalProperties": ref("SkuType")}),
            **errors(401, 404)}, parameters=[query_param(
                "vc", "only the types this virtual cluster has a share of (404 NoVirtualClusterError when there "
                      "is no such cluster)", STRING)], tag="cluster")},
        "/users": {"get": operation("List users", {**answer(200, "Every user (admins only).", {
            "type": "array", "items": ref("UserV2")}), **errors(401, 403)}, tag="users")},
        "/users/{username}": {"parameters": [path_param("username", "the user's name")], "get": operation(
            "Get a user", {**answer(200, "The user (yourself, or anyone for an admin).", ref("UserV2")),
                           **errors(400, 401, 403, 404)}, tag="users")},
        **openapi_nodes.paths(),
    }


def description(*, server_url: str = "/api/v2") -> Schema:
    return {
        "openapi": "3.0.3",
        "info": {"title": "GPU Job Portal REST API v2", "version": "2.0.0",
                 "description": "OpenPAI's v2 job API and protocol v2 configs. Same tokens and errors as v1 "
                                "(/api/v1/openapi.json); every path but the login needs a token."},
        "servers": [{"url": server_url}],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {"schemas": {**_schemas(), **_v2_schemas()},
                       "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
    }
