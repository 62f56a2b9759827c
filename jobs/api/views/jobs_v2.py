"""REST API v2: OpenPAI's v2 job paths (`jobs/{user}~{name}`), protocol v2
configs (YAML, or JSON of the same structure), tags and job attempts.

Same tokens, error codes and rules as v1 (jobs/api/views/jobs.py, whose
helpers these reuse), except that every v2 path needs a signed-in caller:
API_ANONYMOUS_READ opens v1's list and status only. Another user's job is
"not found".
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse

from jobs import exit_spec, services
from jobs.api import openapi_v2, serializers
from jobs.api.auth import Access
from jobs.api.errors import ApiError, invalid, no_job
from jobs.api.http import api_url, handler, int_param, json_body, ok, resource, streamed
from jobs.api.views import jobs as v1
from jobs.ids import parse_id
from jobs.models import FINAL_STATES, Job, JobAttempt, JobTag, State, TaskAttempt, User, VirtualCluster
from jobs.services import listing, tags
from jobs.spec import protocol_of

MAX_PAGE = 1000
ORDER_FIELDS = {
    "jobName": "name", "username": "owner__username", "vc": "virtual_cluster__name", "state": "state",
    "submissionTime": "submitted_at", "createdTime": "submitted_at", "completionTime": "finished_at",
    "retries": "attempt_number", "totalGpuNumber": "total_gpus", "totalTaskNumber": "total_tasks",
}


def _names(value: str | None) -> list[str]:
    return [item for item in (value or "").split(",") if item]


_KEYWORD_FIELDS_LENGTH = max(Job._meta.get_field("name").max_length, User._meta.get_field("username").max_length,
                             VirtualCluster._meta.get_field("name").max_length)


def _filtered(request: HttpRequest) -> QuerySet[Job]:
    """OpenPAI v2's list filters; a comma-separated value means "any of"."""
    params = request.GET
    jobs = Job.objects.visible_to(request.user)
    if usernames := _names(params.get("username")):
        jobs = jobs.filter(owner__username__in=usernames)
    if vcs := _names(params.get("vc")):
        jobs = jobs.filter(virtual_cluster__name__in=vcs)
    if states := _names(params.get("state")):
        # OpenPAI's UNKNOWN is a state of its own that no job here is ever in.
        unknown = sorted(set(states) - set(State.values) - {"UNKNOWN"})
        if unknown:
            raise invalid(f"state {', '.join(unknown)} is not one of {', '.join(State.values)}, UNKNOWN.")
        jobs = jobs.filter(state__in=states)
    if keyword := params.get("keyword"):
        # Longer than every field it is looked for in, it matches nothing (and
        # SQLite would refuse a LIKE pattern over 50,000 bytes).
        jobs = jobs.none() if len(keyword) > _KEYWORD_FIELDS_LENGTH else jobs.filter(
            Q(name__icontains=keyword) | Q(owner__username__icontains=keyword)
            | Q(virtual_cluster__name__icontains=keyword))
    if wanted := _names(params.get("tagsContain")):
        jobs = jobs.filter(pk__in=JobTag.objects.filter(value__in=wanted).values("job_id"))
    if unwanted := _names(params.get("tagsNotContain")):
        jobs = jobs.exclude(pk__in=JobTag.objects.filter(value__in=unwanted).values("job_id"))
    return jobs.order_by(*_order(params.get("order")))


def _order(order: str | None) -> list[str]:
    """`order=<field>[,ASC|DESC]` with a field of ORDER_FIELDS; anything else
    is the default, submissionTime,DESC: OpenPAI's rest-server ignores an
    order it does not know rather than refusing it, and its clients count on
    that. The id last makes the order total, so pages split no ties."""
    field, _, direction = (order or "").partition(",")
    if field not in ORDER_FIELDS or direction.upper() not in ("", "ASC", "DESC"):
        return ["-submitted_at", "-id"]
    sign = "-" if direction.upper() == "DESC" else ""
    return [sign + ORDER_FIELDS[field], sign + "id"]


@handler(Access.USER)
def _list(request: HttpRequest) -> HttpResponse:
    jobs = _filtered(request)
    offset = int_param(request.GET, "offset", default=0, minimum=0, maximum=10**9)
    limit = int_param(request.GET, "limit", default=MAX_PAGE, minimum=1, maximum=MAX_PAGE)
    ids = list(jobs.values_list("pk", flat=True)[offset:offset + limit])
    tags_by_job = listing.tags_of(ids)
    data = [{**serializers.job_summary(job), **_v2_times(job), "tags": tags_by_job.get(job.pk, [])}
            for job in listing.jobs_by_ids(ids)]
    if request.GET.get("withTotalCount") == "true":
        return ok({"totalCount": jobs.count(), "data": data})
    return ok(data)


def _v2_times(job: Job) -> dict:
    """The times OpenPAI's v2 list gives beside v1's createdTime."""
    return {"submissionTime": serializers.millis(job.submitted_at), "launchedTime": serializers.millis(job.started_at)}


@handler(Access.USER)
def _submit(request: HttpRequest) -> HttpResponse:
    v1._count_submission(request)
    job = services.job_submit(owner=request.user, config=request.body)  # type: ignore[arg-type]
    location = api_url(request, "job", username=job.owner.username, name=job.name)
    # OpenPAI's v2 answer repeats its status in the body.
    return ok({"status": 202, "message": f"update job {job.name} successfully"}, status=202,
              headers={"Location": location})


# A job's status lists its newest job attempts, each with every task's
# container; the rest are at .../job-attempts. A job of 1,000 tasks and 100
# retries would otherwise answer each status call with 101,000 of them.
STATUS_ATTEMPTS = 10


def _attempt_bodies(request: HttpRequest, job: Job, attempts: list[JobAttempt]) -> list[dict]:
    """Each job attempt with its tasks' containers, from one query."""
    by_attempt: dict[int, dict[str, list[dict]]] = {
        attempt.pk: {role.name: [] for role in job.spec.task_roles} for attempt in attempts}
    task_attempts = (TaskAttempt.objects.filter(job_attempt__in=[attempt.pk for attempt in attempts])
                     .select_related("task").order_by("number", "task__index"))
    log_url = v1.task_log_urls(request, job)
    for task_attempt in task_attempts:
        task = task_attempt.task
        # Pinned to this attempt: the log endpoint's default is the task's
        # latest, which an earlier attempt's containerLog must not lead to.
        by_attempt[task_attempt.job_attempt_id].setdefault(task.role, []).append(
            serializers.task_status(task, task_attempt, f"{log_url(task)}?attempt={task_attempt.number}"))
    return [_attempt_body(job, attempt, by_attempt[attempt.pk]) for attempt in attempts]


def _attempt_body(job: Job, attempt: JobAttempt, statuses_by_role: dict[str, list[dict]]) -> dict:
    """One job attempt: our fields, then OpenPAI's names for what its
    clients read (`state`, `attemptStartedTime`, `appExitSpec`, ...).
    `attemptIndex` stays 1-based, as `.../job-attempts/<n>` takes it."""
    spec = exit_spec.spec_for(attempt.exit_type)
    return {
        "jobName": job.name,
        "frameworkName": f"{job.owner.username}~{job.name}",
        "userName": job.owner.username,
        "attemptIndex": attempt.number,
        "attemptState": attempt.state,
        "state": attempt.state,
        "isLatest": attempt.number == job.attempt_number,
        "jobStartedTime": serializers.millis(job.submitted_at),
        "createdTime": serializers.millis(attempt.created_at),
        "launchedTime": serializers.millis(attempt.started_at),
        "attemptStartedTime": serializers.millis(attempt.started_at),
        "completedTime": serializers.millis(attempt.finished_at),
        "attemptCompletedTime": serializers.millis(attempt.finished_at),
        "exitCode": attempt.exit_code,
        "exitPhrase": spec.phrase if spec else None,
        "exitType": attempt.exit_type or None,
        "exitDiagnostics": attempt.exit_reason,
        "appExitDiagnostics": attempt.exit_reason or None,
        "appExitSpec": exit_spec.as_openpai(attempt.exit_type, attempt.exit_code),
        **serializers.exit_trigger(attempt),
        "appExitMessages": serializers.exit_messages(attempt),
        "totalGpuNumber": job.total_gpus,
        "totalTaskNumber": job.total_tasks,
        "totalTaskRoleNumber": job.total_roles,
        "taskRoles": {role: {"taskRoleStatus": {"name": role}, "taskStatuses": statuses}
                      for role, statuses in statuses_by_role.items()},
    }


def _status_body(request: HttpRequest, job: Job) -> dict:
    body = v1.status_body(request, job)
    body["protocolVersion"] = protocol_of(job.config_raw)
    body["tags"] = list(job.tags.values_list("value", flat=True))
    newest = sorted(job.attempts.order_by("-number")[:STATUS_ATTEMPTS], key=lambda attempt: attempt.number)
    body["jobAttempts"] = _attempt_bodies(request, job, newest)
    body["jobAttemptCount"] = job.attempts.count() if len(newest) == STATUS_ATTEMPTS else len(newest)
    return body


@handler(Access.USER)
def _status(request: HttpRequest, username: str, name: str) -> HttpResponse:
    return ok(_status_body(request, v1.find_job(request, username, name)))


def _attempt_at(job: Job, attempt_id: str) -> JobAttempt:
    """OpenPAI's jobAttemptId: 0 for the first attempt, as jobStatus.retries
    counts (our attempt numbers count from 1)."""
    index = parse_id(attempt_id)
    if index is None:
        raise invalid(f"jobAttemptId must be a whole number from 0 (the first attempt), not {attempt_id[:40]!r}.")
    attempt = job.attempts.filter(number=index + 1).first() if index < job.attempt_number else None
    if attempt is None:
        raise ApiError("NoJobError", f"Job {job.owner.username}~{job.name} has no attempt of jobAttemptId {index} "
                                     f"(its attempts are 0 to {job.attempt_number - 1}).")
    return attempt


@handler(Access.USER)
def _status_at(request: HttpRequest, username: str, name: str, attempt_id: str) -> HttpResponse:
    """OpenPAI's `.../attempts/<jobAttemptId>`: the job's status with the
    app* fields and task containers of that attempt; the job's own state,
    retries and times stay the job's, as OpenPAI answers it."""
    job = v1.find_job(request, username, name)
    attempt = _attempt_at(job, attempt_id)
    body = _status_body(request, job)
    body["jobStatus"].update(_attempt_app_fields(job, attempt))
    body["taskRoles"] = _attempt_bodies(request, job, [attempt])[0]["taskRoles"]
    return ok(body)


def _attempt_app_fields(job: Job, attempt: JobAttempt) -> dict:
    """The jobStatus fields that OpenPAI takes from the attempt asked for."""
    ended = attempt.state in FINAL_STATES
    return {
        "appId": f"{job.pk}-{attempt.number}",
        "appProgress": 1 if ended else 0,
        "appLaunchedTime": serializers.millis(attempt.started_at),
        "appCompletedTime": serializers.millis(attempt.finished_at),
        "appExitCode": attempt.exit_code,
        "appExitSpec": exit_spec.as_openpai(attempt.exit_type, attempt.exit_code),
        "appExitDiagnostics": attempt.exit_reason,
        **serializers.exit_trigger(attempt),
        "appExitMessages": serializers.exit_messages(attempt),
        "appExitType": attempt.exit_type or None,
    }


@handler(Access.USER)
def _config(request: HttpRequest, username: str, name: str) -> HttpResponse:
    """The config as submitted: YAML for a v2 job, its secrets masked (they
    were masked before it was stored); v1 jobs answer as in v1."""
    job = v1.find_job(request, username, name)
    if protocol_of(job.config_raw) == 1:
        return v1._config(request, username, name)
    return HttpResponse(job.config_raw, content_type="text/yaml; charset=utf-8")


@handler(Access.USER)
def _attempts(request: HttpRequest, username: str, name: str) -> HttpResponse:
    """Every attempt, as OpenPAI lists them, written one attempt at a time:
    a job of 1,000 tasks and 100 retries has 101,000 containers, and a
    worker that every user shares must not hold them all at once. One of
    the caller's limited open streams."""
    job = v1.find_job(request, username, name)
    attempts = list(job.attempts.order_by("number"))

    def parts() -> Iterator[bytes]:
        yield b"["
        for position, attempt in enumerate(attempts):
            body = json.dumps(_attempt_bodies(request, job, [attempt])[0], ensure_ascii=False)
            yield ("," if position else "").encode() + body.encode()
        yield b"]"

    return streamed(request, parts())


@handler(Access.USER)
def _attempts_health(request: HttpRequest, username: str, name: str) -> HttpResponse:
    """OpenPAI's web portal asks this before it offers a job's retry
    history; here the history is always kept, so the answer is "ok" for any
    job the caller may see."""
    v1.find_job(request, username, name)
    return HttpResponse("ok", content_type="text/plain; charset=utf-8")


@handler(Access.USER)
def _attempt(request: HttpRequest, username: str, name: str, number: str) -> HttpResponse:
    job = v1.find_job(request, username, name)
    attempt_number = parse_id(number)
    attempt = job.attempts.filter(number=attempt_number).first() if attempt_number is not None else None
    if attempt is None:
        raise ApiError("NoJobError", f"Job {name} of user {username} has no attempt {number}.")
    return ok(_attempt_bodies(request, job, [attempt])[0])


def _owned_job(request: HttpRequest, username: str, name: str) -> Job:
    """Tags are the owner's, as on the job page: an admin sees them but
    changes none, and gets the same 404 as for a job that is not there."""
    job = v1.find_job(request, username, name)
    if job.owner_id != request.user.pk:
        raise no_job(username, name)
    return job


@handler(Access.USER)
def _tag_add(request: HttpRequest, username: str, name: str) -> HttpResponse:
    job = _owned_job(request, username, name)
    value = json_body(request).get("value")
    tags.job_tag_add(job=job, value=value)
    return ok({"message": f"Add tag {value} for job {name} successfully."})


@handler(Access.USER)
def _tag_remove(request: HttpRequest, username: str, name: str) -> HttpResponse:
    job = _owned_job(request, username, name)
    value = json_body(request).get("value")
    tags.job_tag_remove(job=job, value=value)
    return ok({"message": f"Delete tag {value} from job {name} successfully."})


@handler(Access.PUBLIC)
def _description(request: HttpRequest) -> HttpResponse:
    return ok(openapi_v2.description(server_url=request.path.rsplit("/", 1)[0]))


description = resource(GET=_description)
jobs = resource(GET=_list, POST=_submit)
job = resource(GET=_status)
job_at_attempt = resource(GET=_status_at)
config = resource(GET=_config)
tag = resource(PUT=_tag_add, DELETE=_tag_remove)
attempts = resource(GET=_attempts)
attempts_health = resource(GET=_attempts_health)
attempt = resource(GET=_attempt)
