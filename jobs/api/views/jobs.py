"""Jobs: list, submit, status, config, stop, delete.

Users see and change only their own jobs, admins everyone's; anyone else's
job is "not found", never "forbidden", so job names do not leak. With
API_ANONYMOUS_READ on, the list and the status (nothing else) are open to
anonymous callers, for old tools.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from django.conf import settings
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import reverse

from jobs import jsonc, services
from jobs.api import serializers
from jobs.api.auth import Access
from jobs.api.errors import ApiError, forbidden, invalid, no_job
from jobs.api.http import api_url, handler, int_param, json_body, ok, optional_int_param, resource, streamed
from jobs.models import Job, Task, User
from jobs.services import listing, ratelimit
from jobs.spec import decode_text, protocol_of, yaml_reader

MAX_PAGE = 1000


def visible_jobs(request: HttpRequest) -> QuerySet[Job]:
    if request.user.is_authenticated:
        return Job.objects.visible_to(request.user)
    return Job.objects.all()  # anonymous read, allowed by authenticate()


def find_job(request: HttpRequest, username: str, name: str) -> Job:
    job = visible_jobs(request).filter(owner__username=username, name=name).select_related(
        "owner", "virtual_cluster").first()
    if job is None:
        raise no_job(username, name)
    return job


# Jobs read and written at a time when the whole list is sent.
WHOLE_LIST_CHUNK = 1000


def _whole_list(request: HttpRequest, jobs: QuerySet[Job]) -> StreamingHttpResponse:
    """Every job, as OpenPAI's v1 answered a list without `limit`, written
    as it is read: nothing bounds how many jobs there are, and a worker that
    every user shares must not hold them all at once (100,000 jobs took
    about 220 MB built whole). One of the caller's limited open streams."""

    def parts() -> Iterator[bytes]:
        yield b"["
        batch: list[str] = []
        first = True
        for job in serializers.jobs_for_list(jobs).iterator(chunk_size=WHOLE_LIST_CHUNK):
            batch.append(json.dumps(serializers.job_summary(job), ensure_ascii=False))
            if len(batch) == WHOLE_LIST_CHUNK:
                yield ("" if first else ",").encode() + ",".join(batch).encode()
                batch, first = [], False
        if batch:
            yield ("" if first else ",").encode() + ",".join(batch).encode()
        yield b"]"

    return streamed(request, parts())


def _page(request: HttpRequest, jobs: QuerySet[Job]) -> HttpResponse:
    """All jobs, newest first, as OpenPAI answered; with `limit` (and
    `offset`) one page of them, the total in X-Total-Count and the next page
    in a Link header. Clients that send neither get the whole list."""
    limit = optional_int_param(request.GET, "limit", minimum=1, maximum=MAX_PAGE)
    offset = int_param(request.GET, "offset", default=0, minimum=0, maximum=10**9)
    if limit is None and not offset:
        return _whole_list(request, jobs)
    total = jobs.count()
    size = limit or MAX_PAGE
    # The page's ids first, then only its rows, as the web list does: a deep
    # offset then walks an index instead of loading every row before it.
    ids = list(jobs.values_list("pk", flat=True)[offset:offset + size])
    page = [serializers.job_summary(job) for job in listing.jobs_by_ids(ids)]
    headers = {"X-Total-Count": str(total)}
    if offset + size < total:
        query = request.GET.copy()
        query["offset"], query["limit"] = str(offset + size), str(size)
        headers["Link"] = f'<{request.build_absolute_uri(request.path)}?{query.urlencode()}>; rel="next"'
    return ok(page, headers=headers)


@handler(Access.READ)
def _list_all(request: HttpRequest) -> HttpResponse:
    jobs = visible_jobs(request)
    username = request.GET.get("username")
    if username:
        jobs = jobs.filter(owner__username=username)
    return _page(request, jobs)


@handler(Access.READ)
def _list_users(request: HttpRequest, username: str) -> HttpResponse:
    if request.user.is_authenticated and not request.user.is_admin and request.user.username != username:
        raise forbidden(f"You may list only your own jobs (user/{request.user.username}/jobs).")
    return _page(request, visible_jobs(request).filter(owner__username=username))


def _submitter(request: HttpRequest, username: str) -> User:
    user = request.user
    if user.username != username:
        raise forbidden(f"You may submit jobs only as yourself: use user/{user.username}/jobs.")
    return user  # type: ignore[return-value]


def _count_submission(request: HttpRequest) -> None:
    """At most API_SUBMISSIONS_PER_MINUTE submissions per user, over all
    their tokens and the browser session, accepted or not: a runaway script
    is slowed down before its configs are parsed. Per user, not per token:
    tokens are free to make, so a limit per token would be no limit."""
    limit = settings.API_SUBMISSIONS_PER_MINUTE
    wait = ratelimit.action_wait_seconds(action="api-submit", who=f"user:{request.user.pk}", limit=limit, window=60)
    if wait:
        raise ApiError("TooManyRequestsError", f"More than {limit} job submissions a minute by {request.user.username} "
                       f"(all tokens together); try again in {wait} seconds.", headers={"Retry-After": str(wait)})


def _accepted(request: HttpRequest, job: Job) -> HttpResponse:
    location = api_url(request, "job", username=job.owner.username, name=job.name)
    return ok({"message": f"update job {job.name} successfully"}, status=202, headers={"Location": location})


@handler(Access.USER)
def _submit_named_in_body(request: HttpRequest, username: str) -> HttpResponse:
    owner = _submitter(request, username)
    _count_submission(request)
    return _accepted(request, services.job_submit(owner=owner, config=request.body))


@handler(Access.USER)
def _submit_as_caller(request: HttpRequest) -> HttpResponse:
    """POST /jobs (OpenPAI's later v1): the caller's job, named in the config."""
    _count_submission(request)
    return _accepted(request, services.job_submit(owner=request.user, config=request.body))


def _with_name(body: bytes, name: str) -> str:
    """PUT names the job in its path: the config may leave jobName out, and
    must not contradict the path."""
    text = decode_text(body)
    if protocol_of(text) == 2:
        return _v2_with_name(text, name)
    try:
        value = jsonc.loads(text).value
    except jsonc.JsoncSyntaxError:
        return text  # the parser reports it, with its line and column
    if not isinstance(value, dict):
        return text
    given = value.get("jobName")
    if given is None:
        return json.dumps({"jobName": name, **value})
    if given != name:
        raise invalid(f'jobName "{given}" in the config differs from "{name}" in the path.')
    return text


def _v2_with_name(text: str, name: str) -> str:
    """A v2 config (YAML, or JSON with protocolVersion) names its job in
    `name`. Left out of JSON it is filled in as for v1; YAML is kept as
    typed (its comments with it), so there the schema's own rule applies:
    the parser says `name` is required."""
    try:
        value, is_json = jsonc.loads(text).value, True
    except jsonc.JsoncSyntaxError:
        try:
            value, is_json = yaml_reader.load(text).value, False
        except yaml_reader.YamlProblem:
            return text  # the parser reports it, with its line and column
    if not isinstance(value, dict):
        return text
    given = value.get("name")
    if given is None and is_json:
        return json.dumps({"name": name, **value})
    if given is not None and given != name:
        raise invalid(f'name "{given}" in the config differs from "{name}" in the path.')
    return text


@handler(Access.USER)
def _submit_named_in_path(request: HttpRequest, username: str, name: str) -> HttpResponse:
    owner = _submitter(request, username)
    _count_submission(request)
    return _accepted(request, services.job_submit(owner=owner, config=_with_name(request.body, name)))


@handler(Access.READ)
def _status(request: HttpRequest, username: str, name: str) -> HttpResponse:
    return ok(status_body(request, find_job(request, username, name)))


def task_log_urls(request: HttpRequest, job: Job) -> Callable[[Task], str]:
    """The API URL of each of the job's tasks' logs, from one reverse() per
    task role: a job's v2 status lists 10 attempts of up to 1,000 tasks, and
    a reverse() per container was a third of its time."""
    marker = "9876543210"
    parts: dict[str, tuple[str, str]] = {}

    def url(task: Task) -> str:
        if task.role not in parts:
            whole = api_url(request, "task_log", username=job.owner.username, name=job.name, role=task.role, index=marker)
            head, tail = whole.rsplit(marker, 1)  # the index is the path's last part but "/log"
            parts[task.role] = (head, tail)
        head, tail = parts[task.role]
        return f"{head}{task.index}{tail}"

    return url


def status_body(request: HttpRequest, job: Job) -> dict:
    """v1's job status (v2 adds to it): each task's latest container."""
    attempts = serializers.latest_attempts(job)
    tasks: dict[str, list[Task]] = {}
    for task in Task.objects.filter(job=job).order_by("index"):
        tasks.setdefault(task.role, []).append(task)
    log_url = task_log_urls(request, job)
    task_roles = {}
    for role in job.spec.task_roles:
        statuses = [serializers.task_status(task, attempts.get(task.pk), log_url(task))
                    for task in tasks.get(role.name, [])]
        task_roles[role.name] = {"taskRoleStatus": {"name": role.name}, "taskStatuses": statuses}
    # Attempts are numbered from 1: a job on its first has none before it.
    retried = [] if job.attempt_number <= 1 else list(
        job.attempts.filter(number__lt=job.attempt_number).values_list("exit_type", flat=True))
    page_url = request.build_absolute_uri(reverse("jobs:detail", args=[job.pk]))
    return serializers.job_status(job, task_roles, retried_exit_types=retried, page_url=page_url)


@handler(Access.USER)
def _delete(request: HttpRequest, username: str, name: str) -> HttpResponse:
    job = find_job(request, username, name)
    try:
        services.job_delete(job=job)
    except services.JobStateError as exc:
        raise ApiError("ConflictJobError", f"Job {name} cannot be deleted: {exc}.") from None
    except Job.DoesNotExist:  # deleted by a concurrent request
        raise no_job(username, name) from None
    return ok({"message": f"deleted job {name} successfully"}, status=202)  # OpenPAI's status and words


@handler(Access.USER)
def _config(request: HttpRequest, username: str, name: str) -> HttpResponse:
    """The config as submitted: its own keys and values, defaults not filled
    in (comments, which JSON cannot carry, are left out). A v2 job's YAML
    answers as the same values in JSON, which is what a v1 client reads."""
    job = find_job(request, username, name)
    if not job.config_raw.strip():
        raise ApiError("NoJobConfigError", f"Config of job {name} is not found.")
    try:
        return ok(jsonc.loads(job.config_raw).value)
    except jsonc.JsoncSyntaxError:
        pass
    try:
        return ok(yaml_reader.load(job.config_raw).value)
    except yaml_reader.YamlProblem:
        raise ApiError("NoJobConfigError", f"Config of job {name} is not found.") from None


@handler(Access.USER)
def _execution_type(request: HttpRequest, username: str, name: str) -> HttpResponse:
    job = find_job(request, username, name)
    value = json_body(request).get("value")
    if value not in ("STOP", "START"):
        raise invalid('value must be "STOP" or "START".')
    if value == "START":
        if job.is_final:
            raise invalid(f"Job {name} has ended; submit it again under a new name to run it again.")
        return ok({"message": f"execute job {name} successfully"}, status=202)
    try:
        services.job_stop(job=job, by=request.user)
    except services.JobStateError:
        pass  # already ended: stopping it is done, as the client asked
    except Job.DoesNotExist:  # deleted by a concurrent request
        raise no_job(username, name) from None
    return ok({"message": f"execute job {name} successfully"}, status=202)


jobs = resource(GET=_list_all, POST=_submit_as_caller)
user_jobs = resource(GET=_list_users, POST=_submit_named_in_body)
job = resource(GET=_status, PUT=_submit_named_in_path, DELETE=_delete)
config = resource(GET=_config)
execution_type = resource(PUT=_execution_type)
