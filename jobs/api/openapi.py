"""The API's OpenAPI 3.0 description, served at /api/v1/openapi.json.

It is written by hand next to the views it describes and checked against
them: tests/test_api_fuzz.py runs schemathesis over it against a live portal
(every documented status and shape, no 500s), and tests/test_api.py checks
that every route is described.
"""

from __future__ import annotations

from typing import Any

from jobs import spec
from jobs.models import State, Stream, TaskState
from jobs.services import tokens

Schema = dict[str, Any]

JOB_STATES = list(State.values)
# The API calls a task with no container yet WAITING, before the stored states.
# As OpenPAI names them: a task placed but not started yet is WAITING.
TASK_STATES = ["WAITING", *(state for state in TaskState.values if state not in ("ASSIGNED", "LAUNCHING"))]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = required
    return schema


def nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
NUMBER: Schema = {"type": "number"}
MILLIS: Schema = {"type": "integer", "description": "milliseconds since the epoch"}
# What ended a job or job attempt (OpenPAI's names), in the job status and
# in each v2 job attempt.
EXIT_TRIGGER: dict[str, Schema] = {
    "appExitTriggerMessage": nullable({
        "type": "string",
        "description": "what ended it: the completion rule that fired (minFailedTaskCount, minSucceededTaskCount, "
                       "killAllOnCompletedTaskNumber, or all tasks completed), or who stopped it; null until it "
                       "ends"}),
    "appExitTriggerTaskRoleName": nullable({
        "type": "string", "description": "the task role of the task whose completion fired the rule; null for a stop"}),
    "appExitTriggerTaskIndex": nullable({
        "type": "integer", "minimum": 0,
        "description": "that task's index in its role; null for a stop"}),
}

# Why a job or job attempt ended, in the shape OpenPAI's clients and job
# page read (appExitMessages.runtime.originalUserExitCode).
EXIT_MESSAGES: dict[str, Schema] = {
    "appExitMessages": nullable(obj({
        "container": nullable({"type": "string", "description": "always null: a task's output is its log"}),
        "runtime": nullable(obj({"originalUserExitCode": INTEGER}, ["originalUserExitCode"],
                                description="the exit code of the user's command that ended it; null unless a "
                                            "task's command exited non-zero")),
        "launcher": nullable({"type": "string", "description": "why it ended, in words (as appExitDiagnostics)"}),
    }, ["container", "runtime", "launcher"], description="null until it ends")),
}

ERROR_TEXT = {
    400: "Invalid parameters (InvalidParametersError, with every problem in the message), or a bad login.",
    401: "No credentials, or a token that is unknown, expired or revoked (UnauthorizedUserError).",
    403: "Not allowed (ForbiddenUserError, NoEnoughQuotaError, RemoveAdminError).",
    404: "Not found, or not yours: NoJobError, NoJobConfigError, NoJobSshInfoError, NoTaskError, "
         "NoVirtualClusterError, NoUserError.",
    409: "Conflict: ConflictJobError (a job of that name exists, or it is not in a state for this), "
         "ConflictUserError.",
    413: "The request body is over the portal's size limit (RequestTooLargeError).",
    429: "Too many requests (TooManyRequestsError): failed logins, job submissions past the per-user "
         "limit, or more streamed answers (whole lists) open at once than STREAMED_RESPONSES_PER_USER; see "
         "Retry-After.",
    503: "The web worker is sending as many streamed answers as it may at once, all its threads but two "
         "(ServiceUnavailableError); see Retry-After.",
}


def errors(*statuses: int) -> dict[str, Any]:
    return {str(status): {"description": ERROR_TEXT[status], "content": {"application/json": {"schema": ref("Error")}}}
            for status in statuses}


def body(schema: Schema, *, required: bool = True, form: bool = False) -> Schema:
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if form:
        content["application/x-www-form-urlencoded"] = {"schema": schema}
    return {"required": required, "content": content}


def answer(status: int, description: str, schema: Schema, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        result["headers"] = headers
    return {str(status): result}


def operation(summary: str, responses: dict[str, Any], *, public: bool = False, parameters: list[Schema] | None = None,
              request_body: Schema | None = None, description: str = "", tag: str = "") -> Schema:
    op: Schema = {"summary": summary, "responses": responses, "operationId": _operation_id(summary)}
    if description:
        op["description"] = description
    if tag:
        op["tags"] = [tag]
    if public:
        op["security"] = []
    if parameters:
        op["parameters"] = parameters
    if request_body:
        op["requestBody"] = request_body
    return op


def _operation_id(summary: str) -> str:
    words = [w for w in "".join(c if c.isalnum() else " " for c in summary).split() if w]
    return words[0].lower() + "".join(w.capitalize() for w in words[1:])


def path_param(name: str, description: str, schema: Schema | None = None) -> Schema:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema or STRING}


def query_param(name: str, description: str, schema: Schema) -> Schema:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


USERNAME = path_param("username", "the job owner's username")
JOB_NAME = path_param("name", "the job's name")
JOB_PARAMS = [USERNAME, JOB_NAME]
PAGING = [
    query_param("limit", "page size; without it (and without offset) the whole list comes back, streamed (one "
                "of the caller's STREAMED_RESPONSES_PER_USER open streams)",
                {"type": "integer", "minimum": 1, "maximum": 1000}),
    query_param("offset", "jobs to skip (with limit)", {"type": "integer", "minimum": 0}),
]
PAGE_HEADERS = {
    "X-Total-Count": {"description": "all matching jobs (sent with limit or offset)", "schema": STRING},
    "Link": {"description": 'the next page, rel="next"', "schema": STRING},
}


def _schemas() -> dict[str, Schema]:
    port = obj({"label": {"type": "string", "pattern": spec.LABEL_RE.pattern, "maxLength": 64},
                "beginAt": {"type": "integer", "minimum": 0, "maximum": 65535},
                "portNumber": {"type": "integer", "minimum": 1, "maximum": spec.MAX_PORT_NUMBER}},
               ["label", "beginAt", "portNumber"])
    task_role = obj({
        "name": {"type": "string", "pattern": spec.ROLE_NAME_RE.pattern, "maxLength": 64},
        "taskNumber": {"type": "integer", "minimum": 1, "maximum": spec.MAX_TASK_NUMBER},
        "cpuNumber": {"type": "integer", "minimum": 1, "maximum": spec.MAX_CPU_NUMBER},
        "memoryMB": {"type": "integer", "minimum": 100, "maximum": spec.MAX_MEMORY_MB},
        "shmMB": {"type": "integer", "minimum": 0, "maximum": spec.MAX_MEMORY_MB},
        "gpuNumber": {"type": "integer", "minimum": 0, "maximum": spec.MAX_GPU_NUMBER},
        "portList": {"type": "array", "items": port},
        "command": {"type": "string", "minLength": 1},
        "minFailedTaskCount": nullable({"type": "integer", "minimum": 1}),
        "minSucceededTaskCount": nullable({"type": "integer", "minimum": 1}),
    }, ["name", "taskNumber", "cpuNumber", "memoryMB", "gpuNumber", "command"])
    job_config = obj({
        "jobName": {"type": "string", "pattern": spec.JOB_NAME_RE.pattern, "maxLength": spec.MAX_NAME_LENGTH},
        "image": {"type": "string", "pattern": r"^\S+$", "maxLength": 512},
        "authFile": STRING, "dataDir": STRING, "outputDir": STRING, "codeDir": STRING,
        "virtualCluster": {"type": "string", "pattern": spec.VC_NAME_RE.pattern, "maxLength": 64},
        "gpuType": STRING,
        "retryCount": {"type": "integer", "minimum": 0, "maximum": spec.MAX_RETRY_COUNT},
        "killAllOnCompletedTaskNumber": nullable({"type": "integer", "minimum": 0}),
        "jobEnvs": {"type": "object", "additionalProperties": True},
        "extras": {"type": "object", "additionalProperties": True},
        "taskRoles": {"type": "array", "minItems": 1, "items": task_role},
    }, ["jobName", "image", "taskRoles"], description="An OpenPAI v1 job config (see the reference documents). "
       "JSON with // and /* */ comments is accepted too.")
    task_status = obj({
        "taskIndex": INTEGER, "taskState": {"type": "string", "enum": TASK_STATES},
        "containerId": nullable(STRING), "containerIp": nullable(STRING),
        "containerPorts": {"type": "object", "additionalProperties": STRING,
                           "description": 'label: "port,port"'},
        "containerGpus": {"type": "integer", "description": "bit i set for GPU i"},
        "containerLog": {"type": "string", "description": "URL of this task's log (GET, authenticated)"},
        "containerExitCode": nullable(INTEGER),
        "containerNodeName": nullable(STRING),
        "containerExitSpec": nullable(ref("ExitSpec")),
        "containerExitDiagnostics": nullable(STRING),
        "createdTime": nullable(MILLIS), "launchedTime": nullable(MILLIS), "completedTime": nullable(MILLIS),
        "attempt": nullable(INTEGER),
    }, ["taskIndex", "taskState", "containerId", "containerIp", "containerPorts", "containerGpus", "containerLog",
        "containerExitCode"])
    amounts = obj({"memory": NUMBER, "vCores": NUMBER, "GPUs": NUMBER}, ["memory", "vCores", "GPUs"])
    virtual_cluster = obj({
        "name": STRING, "description": STRING, "status": STRING,
        "capacity": NUMBER, "maxCapacity": NUMBER, "usedCapacity": NUMBER,
        "numActiveJobs": INTEGER, "numPendingJobs": INTEGER, "numJobs": INTEGER,
        "resourcesUsed": amounts, "resourcesTotal": amounts,
        "gpuTypes": {"type": "object", "additionalProperties": obj({"used": NUMBER, "total": NUMBER})},
        "allowed": {"type": "boolean", "description": "whether you may submit jobs here"},
    }, ["name", "capacity", "usedCapacity", "numActiveJobs", "numPendingJobs", "numJobs", "resourcesUsed",
        "resourcesTotal", "gpuTypes"])
    # v2's, and v1's too: OpenPAI serves a job's attempts under v1's /jobs as well.
    job_attempt = obj({
        "jobName": STRING, "frameworkName": STRING, "userName": STRING,
        "attemptIndex": {**INTEGER, "description": "1 is the first"}, "attemptState": STRING,
        "state": {**STRING, "description": "the same as attemptState (OpenPAI's name)"},
        "isLatest": {"type": "boolean"}, "jobStartedTime": INTEGER,
        "createdTime": INTEGER, "launchedTime": nullable(INTEGER), "attemptStartedTime": nullable(INTEGER),
        "completedTime": nullable(INTEGER), "attemptCompletedTime": nullable(INTEGER), "exitCode": nullable(INTEGER),
        "exitPhrase": nullable(STRING), "exitType": nullable(STRING),
        "exitDiagnostics": STRING, "appExitDiagnostics": nullable(STRING),
        "appExitSpec": nullable(ref("ExitSpec")), **EXIT_TRIGGER, **EXIT_MESSAGES,
        "totalGpuNumber": INTEGER, "totalTaskNumber": INTEGER, "totalTaskRoleNumber": INTEGER,
        "taskRoles": {"type": "object", "additionalProperties": obj({
            "taskRoleStatus": obj({"name": STRING}, ["name"]),
            "taskStatuses": {"type": "array", "items": ref("TaskStatus")}})},
    }, ["attemptIndex", "attemptState", "state", "isLatest", "taskRoles"])
    return {
        "Error": obj({"code": STRING, "message": STRING}, ["code", "message"]),
        "Message": obj({"message": STRING}, ["message"]),
        "Info": obj({"name": STRING, "version": STRING, "launcherType": STRING, "authnMethod": STRING},
                    ["name", "version", "launcherType", "authnMethod"]),
        "TokenRequest": obj({
            "username": {"type": "string", "maxLength": 150},
            "password": {"type": "string", "maxLength": 4096},
            "expiration": {"oneOf": [
                {"type": "integer", "minimum": tokens.API_MIN_SECONDS, "maximum": tokens.API_MAX_SECONDS},
                {"type": "string", "pattern": "^[0-9]{1,9}$"},
            ], "description": f"seconds, {tokens.API_MIN_SECONDS} to {tokens.API_MAX_SECONDS} (default "
                              f"{tokens.API_DEFAULT_SECONDS}); a numeric string is accepted too"},
            "label": {"type": "string", "maxLength": 100},
        }, ["username", "password"]),
        "Token": obj({"token": STRING, "user": STRING, "admin": BOOLEAN, "expiresAt": STRING},
                     ["token", "user", "admin"]),
        "JobConfig": job_config,
        "TaskStatus": task_status,
        "JobAttempt": job_attempt,
        "ExitSpec": obj({
            "code": nullable(INTEGER), "phrase": STRING, "causer": {"type": "string", "enum": ["USER", "PLATFORM"]},
            "type": {"type": "string", "enum": ["USER_SUCCESS", "USER_STOP", "USER_FAILURE", "PLATFORM_FAILURE"]},
            "stage": STRING, "behavior": {"type": "string", "enum": ["TRANSIENT", "PERMANENT", "UNKNOWN"]},
            "reaction": {"type": "string", "enum": ["RETRY_TO_MAX", "NEVER_RETRY"]}, "reason": STRING,
            "repro": {"type": "array", "items": STRING}, "solution": {"type": "array", "items": STRING},
        }, ["code", "phrase", "type", "reason", "solution"],
            description="How a job, attempt or task ended and what to do about it (OpenPAI's exit spec)"),
        "JobSummary": obj({
            "name": STRING, "username": STRING, "state": {"type": "string", "enum": JOB_STATES},
            "subState": STRING, "executionType": {"type": "string", "enum": ["START", "STOP"]},
            "retries": INTEGER, "createdTime": MILLIS, "completedTime": nullable(MILLIS),
            "appExitCode": nullable(INTEGER), "virtualCluster": STRING, "totalGpuNumber": INTEGER,
            "totalTaskNumber": INTEGER, "totalTaskRoleNumber": INTEGER,
        }, ["name", "username", "state", "subState", "executionType", "retries", "createdTime", "completedTime",
            "appExitCode", "virtualCluster", "totalGpuNumber", "totalTaskNumber", "totalTaskRoleNumber"]),
        "JobStatus": obj({
            "name": STRING,
            "jobStatus": obj({
                "username": STRING, "state": {"type": "string", "enum": JOB_STATES}, "subState": STRING,
                "executionType": {"type": "string", "enum": ["START", "STOP"]}, "retries": INTEGER,
                "retryDetails": obj({"user": INTEGER, "platform": INTEGER, "resource": INTEGER},
                                    ["user", "platform", "resource"],
                                    description="retries by cause: the job's own failures (user) and the rest"),
                "createdTime": MILLIS, "completedTime": nullable(MILLIS),
                "appId": {"type": "string", "description": "the current attempt: <job id>-<attempt>"},
                "appProgress": {"type": "integer", "enum": [0, 1], "description": "1 once the job has ended"},
                "appTrackingUrl": {"type": "string", "description": "the job's page"},
                "appLaunchedTime": nullable(MILLIS),
                "appCompletedTime": nullable(MILLIS), "appExitCode": nullable(INTEGER),
                "appExitSpec": nullable(ref("ExitSpec")),
                "appExitDiagnostics": STRING, **EXIT_TRIGGER, **EXIT_MESSAGES,
                "appExitType": nullable(STRING), "virtualCluster": STRING,
            }, ["username", "state", "subState", "executionType", "retries", "createdTime", "virtualCluster"]),
            "taskRoles": {"type": "object", "additionalProperties": obj({
                "taskRoleStatus": obj({"name": STRING}, ["name"]),
                "taskStatuses": {"type": "array", "items": ref("TaskStatus")},
            }, ["taskRoleStatus", "taskStatuses"])},
        }, ["name", "jobStatus", "taskRoles"]),
        "ExecutionType": obj({"value": {"type": "string", "enum": ["STOP", "START"]}}, ["value"]),
        "SshInfo": obj({
            "containers": {"type": "array", "items": obj({
                "id": nullable(STRING), "sshIp": STRING, "sshPort": STRING, "taskRole": STRING, "taskIndex": INTEGER,
            }, ["id", "sshIp", "sshPort"])},
            "keyPair": obj({
                "folderPath": STRING, "publicKeyFileName": STRING, "privateKeyFileName": STRING,
                "privateKeyDirectDownloadLink": nullable({"type": "string", "description": "for the job's owner only"}),
                "publicKey": STRING,
            }, ["privateKeyDirectDownloadLink"]),
        }, ["containers", "keyPair"]),
        "LogPage": obj({
            "attempt": nullable(INTEGER), "taskState": STRING, "stream": STRING,
            "lines": {"type": "array", "items": STRING},
            "next": {"type": "integer", "description": "pass back as `after` for the lines that follow"},
            "more": {"type": "boolean", "description": "more lines are stored after this page"},
            "truncated": {"type": "boolean", "description": "the stream passed the per-task size limit"},
        }, ["lines", "next", "more"]),
        "UsageSample": obj({
            "time": STRING, "cpuPercent": {"type": "number", "description": "100 = one core busy"},
            "memoryBytes": INTEGER, "networkRxBytes": INTEGER, "networkTxBytes": INTEGER,
            "blockReadBytes": INTEGER, "blockWriteBytes": INTEGER,
            "gpus": {"type": "array", "description": "real GPUs only (NVML); empty for simulated GPUs",
                     "items": obj({"index": INTEGER, "utilPercent": NUMBER, "memoryUsedBytes": INTEGER})},
        }, ["time", "cpuPercent", "memoryBytes", "gpus"]),
        "TaskUsage": obj({"attempt": nullable(INTEGER), "taskState": STRING,
                          "samples": {"type": "array", "items": ref("UsageSample")}}, ["samples"]),
        "VirtualCluster": virtual_cluster,
        "UserChange": obj({
            "username": {"type": "string", "maxLength": 64}, "password": {"type": "string", "maxLength": 4096},
            "oldPassword": {"type": "string", "maxLength": 4096,
                            "description": "the current password; required to change one's own"},
            "admin": BOOLEAN, "modify": {"type": "boolean", "description": "false: create; true: change"},
        }, ["username"]),
        # Not required: ?username= may name the user instead (DELETE /user).
        "UserName": obj({"username": {"type": "string", "maxLength": 64,
                                      "description": "the user; or give ?username= instead"}}),
        "UserVirtualClusters": obj({"virtualClusters": {
            "oneOf": [{"type": "string", "description": "names separated by commas"},
                      {"type": "array", "items": STRING}]}}, ["virtualClusters"]),
        "User": obj({"username": STRING, "admin": BOOLEAN, "active": BOOLEAN, "virtualCluster": STRING,
                     "hasGithubPAT": {"type": "boolean", "description": "always false: no GitHub token is kept"}},
                    ["username", "admin", "virtualCluster"]),
        "Webhook": obj({"url": nullable({"type": "string", "description": "null when none is set"})}, ["url"]),
        "WebhookChange": obj({
            "url": {"type": "string", "maxLength": 2000, "description": "http:// or https://; its host must resolve "
                    "inside WEBHOOK_ALLOWED_NETWORKS (public addresses by default) when a delivery is made"},
            "secret": {"type": "string", "minLength": 16, "maxLength": 256,
                       "description": "deliveries carry X-Portal-Delivery (the delivery's id, the same on each "
                       "try), X-Portal-Timestamp (Unix seconds of the try) and X-Portal-Signature: v1=<hex "
                       "HMAC-SHA256 with this secret of '<delivery>.<timestamp>.<raw body>'>. A receiver "
                       "refuses a timestamp outside its tolerance (e.g. 5 minutes), compares the signature "
                       "in constant time, and drops a delivery id it has already taken (README, Webhooks)."},
        }, ["url", "secret"]),
        "UserDetail": obj({"username": STRING, "admin": BOOLEAN, "active": BOOLEAN, "virtualCluster": STRING,
                           "virtualClusters": {"type": "array", "items": STRING}},
                          ["username", "admin", "virtualClusters"]),
    }


def _job_operations(accepted: Schema, submit_errors: Schema) -> dict[str, Schema]:
    """A job's operations by path suffix, served under
    /user/{username}/jobs/{name} and /jobs/{username}~{name} alike."""
    message = ref("Message")
    return {
        "": {
            "get": operation("Get a job's status", {**answer(200, "The job and its tasks.", ref("JobStatus")),
                                                     **errors(401, 404)}, tag="jobs"),
            "put": operation("Submit a job by name", {**accepted, **submit_errors}, request_body=body(ref("JobConfig")),
                             tag="jobs", description="jobName may be left out of the config; if given it must "
                             "match the path."),
            "delete": operation("Delete a finished job", {**answer(202, "Deleted, with its tasks and logs.", message),
                                                           **errors(401, 404, 409)}, tag="jobs"),
        },
        "/config": {"get": operation(
            "Get a job's config", {**answer(200, "The config as submitted (comments left out).",
                                            {"type": "object", "additionalProperties": True}),
                                   **errors(401, 404)}, tag="jobs")},
        "/executionType": {"put": operation(
            "Stop a job", {**answer(202, "Stopping (or already ended).", message), **errors(400, 401, 404, 413)},
            request_body=body(ref("ExecutionType")), tag="jobs")},
        "/ssh": {"get": operation(
            "Get a job's SSH info", {**answer(200, "Where each running task's sshd listens, and the key.",
                                              ref("SshInfo")), **errors(401, 404)}, tag="access")},
    }


def _paths() -> dict[str, Schema]:
    message = ref("Message")
    accepted = answer(202, "Accepted: the job waits for the scheduler.", message,
                      {"Location": {"description": "the job's status URL", "schema": STRING}})
    submit_errors = errors(400, 401, 403, 404, 409, 413, 429)
    job = _job_operations(accepted, submit_errors)
    return {
        "/": {"get": operation("Get API info", answer(200, "What this server is.", ref("Info")), public=True,
                               tag="api")},
        "/openapi.json": {"get": operation("Get this description", answer(
            200, "The OpenAPI 3 description of this API.", {"type": "object", "additionalProperties": True}),
            public=True, tag="api")},
        "/token": token_path("Get a token"),
        "/authn/basic/login": token_path("Log in"),
        "/jobs": {
            "get": operation(
                "List jobs", {**answer(200, "Your jobs (an admin: everyone's), newest first.",
                                       {"type": "array", "items": ref("JobSummary")}, PAGE_HEADERS),
                              **errors(400, 401, 429, 503)},
                parameters=[query_param("username", "only this user's jobs", STRING), *PAGING], tag="jobs"),
            "post": operation("Submit a job as yourself", {**accepted, **submit_errors},
                              request_body=body(ref("JobConfig")), tag="jobs",
                              description="As POST /user/{username}/jobs with your own name."),
        },
        **_framework_paths(accepted, submit_errors),
        **attempt_paths(),
        "/user/{username}/jobs": {
            "parameters": [USERNAME],
            "get": operation("List a user's jobs", {
                **answer(200, "The user's jobs, newest first.", {"type": "array", "items": ref("JobSummary")},
                         PAGE_HEADERS), **errors(400, 401, 403, 429, 503)}, parameters=PAGING, tag="jobs"),
            "post": operation("Submit a job", {**accepted, **submit_errors}, request_body=body(ref("JobConfig")),
                              tag="jobs", description="The job is named by jobName in the config. Every problem "
                              "with the config is listed in the message (and in `problems`). Refused with 403 "
                              "NoEnoughQuotaError when you have as many waiting jobs in the virtual cluster as an "
                              "admin allows you there."),
        },
        **{f"/user/{{username}}/jobs/{{name}}{suffix}": {"parameters": JOB_PARAMS, **operations}
           for suffix, operations in job.items()},
        "/user/{username}/jobs/{name}/ssh/key": {"parameters": JOB_PARAMS, "get": operation(
            "Download a job's private key", {
                "200": {"description": "The OpenSSH private key (the job's owner only).",
                        "content": {"application/x-pem-file": {"schema": STRING}}},
                **errors(401, 404)}, tag="access")},
        "/user/{username}/jobs/{name}/tasks/{role}/{index}/log": {
            "parameters": [*JOB_PARAMS, path_param("role", "the task role"),
                           path_param("index", "the task's index", {"type": "integer", "minimum": 0})],
            "get": operation("Read a task's log", {**answer(200, "Lines after the cursor.", ref("LogPage")),
                                                   **errors(400, 401, 404)}, tag="access", parameters=[
                query_param("stream", "which output", {"type": "string", "enum": list(Stream.labels)}),
                query_param("after", "cursor: `next` of the previous page (-1 or absent: from the start)",
                            {"type": "integer", "minimum": -1}),
                query_param("limit", "lines at most", {"type": "integer", "minimum": 1, "maximum": 5000}),
                query_param("attempt", "the job attempt (default: the latest with a container)",
                            {"type": "integer", "minimum": 1}),
            ])},
        "/user/{username}/jobs/{name}/tasks/{role}/{index}/metrics": {
            "parameters": [*JOB_PARAMS, path_param("role", "the task role"),
                           path_param("index", "the task's index", {"type": "integer", "minimum": 0})],
            "get": operation("Read a task's usage samples", {
                **answer(200, "CPU, memory, network, block I/O and GPU samples, oldest first.", ref("TaskUsage")),
                **errors(400, 401, 404)}, tag="access", parameters=[
                query_param("since", "only samples after this ISO-8601 time", {"type": "string"}),
                query_param("attempt", "the job attempt (default: the latest)", {"type": "integer", "minimum": 1}),
            ], description="The job's owner and admins only.")},
        **virtual_cluster_paths(),
        "/user": {
            "get": operation("List users", {**answer(200, "Every user (admins only).",
                                                     {"type": "array", "items": ref("User")}), **errors(401, 403)},
                             tag="users"),
            "put": operation("Create or change a user", {**answer(201, "Done.", message),
                                                        **errors(400, 401, 403, 404, 409, 413, 429)},
                             request_body=body(ref("UserChange")), tag="users",
                             description="Admins create (modify: false) and change (modify: true) users; a user may "
                                         "change their own password, giving the current one as oldPassword "
                                         "(wrong ones count as failed logins: 429 once too many). "
                                         "A changed password revokes the user's other tokens and ends their "
                                         "browser sessions."),
            "delete": operation("Remove a user", {**answer(200, "Removed, with their finished jobs.", message),
                                                 **errors(400, 401, 403, 404, 409, 413)},
                                request_body=body(ref("UserName"), required=False), tag="users",
                                parameters=[query_param("username", "instead of the body", STRING)]),
        },
        "/user/{username}": {"parameters": [USERNAME], "get": operation(
            "Get a user", {**answer(200, "The user and the virtual clusters they may submit to (yourself, or "
                                         "anyone for an admin).", ref("UserDetail")), **errors(400, 401, 403, 404)},
            tag="users")},
        "/user/{username}/webhook": {
            "parameters": [USERNAME],
            "get": operation("Get a user's webhook", {**answer(200, "Where the user's job state changes are posted "
                                                                   "(the secret is never shown).", ref("Webhook")),
                                                        **errors(400, 401, 403)}, tag="users"),
            "put": operation("Set a user's webhook", {**answer(200, "Set.", ref("Webhook")),
                                                      **errors(400, 401, 403, 413)},
                             request_body=body(ref("WebhookChange")), tag="users",
                             description="The user or an admin. On every change of one of the user's jobs to "
                                         "RUNNING, SUCCEEDED, FAILED or STOPPED the portal POSTs "
                                         '`{"event": "jobStateChanged", "job": "<user>~<name>", "jobName", "user", '
                                         '"state", "previousState", "exitReason", "appExitTriggerMessage", '
                                         '"appExitTriggerTaskRoleName", "appExitTriggerTaskIndex", "time", "url"}` '
                                         "(the appExitTrigger* as in the job status: null for RUNNING and for a "
                                         "stop's task), signed with the secret over the delivery id, the try's timestamp "
                                         "and the body (X-Portal-Delivery, X-Portal-Timestamp, X-Portal-Signature: "
                                         "see WebhookChange.secret), and tries again "
                                         "a few times on failure."),
            "delete": operation("Remove a user's webhook", {**answer(200, "Removed (or there was none).", message),
                                                            **errors(400, 401, 403)}, tag="users"),
        },
        "/user/{username}/virtualClusters": {"parameters": [USERNAME], "put": operation(
            "Set a user's virtual clusters", {**answer(201, "Done.", message), **errors(400, 401, 403, 404, 413)},
            request_body=body(ref("UserVirtualClusters")), tag="users")},
    }


def token_path(summary: str) -> Schema:
    """POST /token, and OpenPAI's login path for it (/authn/basic/login,
    v1's and v2's): the same view, body and answer."""
    return {"post": operation(
        summary, {**answer(200, "A bearer token.", ref("Token")), **errors(400, 413, 429)}, public=True,
        request_body=body(ref("TokenRequest"), form=True), tag="auth",
        description="Send it as `Authorization: Bearer <token>`. A wrong password and an unknown user get the "
                    "same IncorrectPasswordError. Repeated failures are refused for a while (429).")}


def virtual_cluster_paths() -> dict[str, Schema]:
    """Served the same under v1 and v2."""
    return {
        "/virtual-clusters": {"get": operation(
            "List virtual clusters", {**answer(200, "Every virtual cluster by name.",
                                               {"type": "object", "additionalProperties": ref("VirtualCluster")}),
                                      **errors(401)}, tag="cluster")},
        "/virtual-clusters/{vc}": {"parameters": [path_param("vc", "the virtual cluster's name")], "get": operation(
            "Get a virtual cluster", {**answer(200, "Its share, use and jobs.", ref("VirtualCluster")),
                                      **errors(401, 404)}, tag="cluster")},
    }


def attempt_paths() -> dict[str, Schema]:
    """A job's attempts: v2's paths, which OpenPAI serves under v1's /jobs too."""
    return {
        "/jobs/{username}~{name}/job-attempts": {"parameters": JOB_PARAMS, "get": operation(
            "List a job's attempts", {**answer(200, "Every attempt, first first.",
                                               {"type": "array", "items": ref("JobAttempt")}),
                                     **errors(401, 404, 429, 503)},
            tag="jobs")},
        "/jobs/{username}~{name}/job-attempts/healthz": {"parameters": JOB_PARAMS, "get": operation(
            "Whether job attempts can be listed", {
                "200": {"description": "Always \"ok\": every attempt is kept.",
                        "content": {"text/plain": {"schema": STRING}}},
                **errors(401, 404)}, tag="jobs")},
        "/jobs/{username}~{name}/job-attempts/{number}": {
            "parameters": [*JOB_PARAMS, path_param("number", "the attempt (1 is the first)",
                                                   {"type": "integer", "minimum": 1})],
            "get": operation("Get a job attempt", {**answer(200, "The attempt and its tasks.", ref("JobAttempt")),
                                                   **errors(401, 404)}, tag="jobs")},
    }


def _framework_paths(accepted: Schema, submit_errors: Schema) -> dict[str, Schema]:
    """OpenPAI's later v1 paths, /jobs/<user>~<job>: the same operations as
    under /user/{username}/jobs/{name}, with operation ids of their own."""
    return {f"/jobs/{{username}}~{{name}}{suffix}": {"parameters": JOB_PARAMS, **{
        method: {**op, "summary": op["summary"] + " (by framework name)",
                 "operationId": op["operationId"] + "ByFrameworkName"} for method, op in operations.items()}}
        for suffix, operations in _job_operations(accepted, submit_errors).items()}


def description(*, server_url: str = "/api/v1") -> Schema:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "GPU Job Portal REST API",
            "version": "1.0.0",
            "description": "OpenPAI's v1 REST API. Served under /api/v1 and /rest-server/api/v1. Get a token with "
                           "POST /token and send it as `Authorization: Bearer <token>`. Errors are "
                           '`{"code": ..., "message": ...}` with OpenPAI\'s code names.',
        },
        "servers": [{"url": server_url}],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
    }
