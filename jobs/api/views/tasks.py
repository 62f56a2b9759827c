"""What a job's tasks offer: SSH details, the job's private key, logs.

None of these is ever open to anonymous callers.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from jobs.api import serializers
from jobs.api.auth import Access
from jobs.api.errors import ApiError, invalid, no_job
from jobs.api.http import api_url, handler, int_param, ok, optional_int_param, resource
from jobs.api.views.jobs import find_job
from jobs.ids import parse_id
from jobs.logs import read_lines
from jobs.models import ACTIVE_TASK_STATES, Stream, Task, TaskAttempt
from jobs.services.access import job_private_key, ssh_access, ssh_key_file_name

STREAMS = {stream.label: stream for stream in Stream}  # stdout, stderr, platform
MAX_LINES = 5000


@handler(Access.USER)
def _ssh(request: HttpRequest, username: str, name: str) -> HttpResponse:
    job = find_job(request, username, name)
    if not job.ssh_private_key:  # it gets its key pair when its first task launches
        raise ApiError("NoJobSshInfoError", f"SSH info of job {name} is not found: the job has not started yet.")
    if job.is_final:
        raise ApiError("NoJobSshInfoError", f"SSH info of job {name} is not found: the job has ended, and SSH "
                                            "works only while its tasks run.")
    containers = []
    attempts = TaskAttempt.objects.filter(job=job, number=job.attempt_number, state__in=ACTIVE_TASK_STATES)
    for attempt in attempts.select_related("task").order_by("id"):
        info = ssh_access(attempt)
        if info.port and info.available is not False:
            containers.append({"id": attempt.container_id or None, "sshIp": info.host, "sshPort": str(info.port),
                               "taskRole": attempt.task.role, "taskIndex": attempt.task.index})
    may_download = job_private_key(job=job, user=request.user) is not None
    key_url = api_url(request, "ssh_key", username=username, name=name)
    return ok({
        "containers": containers,
        "keyPair": {
            "folderPath": key_url.rsplit("/", 1)[0],
            "publicKeyFileName": f"{job.name}.pub",
            "privateKeyFileName": ssh_key_file_name(job),
            "privateKeyDirectDownloadLink": key_url if may_download else None,
            "publicKey": job.ssh_public_key,
        },
    })


@handler(Access.USER)
def _ssh_key(request: HttpRequest, username: str, name: str) -> HttpResponse:
    """The job's private key, for its owner only (the web page's rule, one
    service: an admin who may see the job gets the same 404 as a stranger)."""
    job = find_job(request, username, name)
    key = job_private_key(job=job, user=request.user)
    if key is None:
        raise no_job(username, name)
    response = HttpResponse(key, content_type="application/x-pem-file")
    response["Content-Disposition"] = f'attachment; filename="{ssh_key_file_name(job)}"'
    response["Cache-Control"] = "no-store"
    return response


def _task(job_id: int, role: str, index: str) -> Task:
    number = parse_id(index)
    task = Task.objects.filter(job_id=job_id, role=role, index=number).first() if number is not None else None
    if task is None:
        raise ApiError("NoTaskError", f"The job has no task {role}-{index}.")
    return task


def _asked_attempt(request: HttpRequest, task: Task) -> TaskAttempt | None:
    """The attempt `?attempt=N` names, or the task's latest; None if it has
    none yet. A named attempt that does not exist is an error."""
    number = optional_int_param(request.GET, "attempt", minimum=1, maximum=10**6)
    attempts = TaskAttempt.objects.filter(task=task)
    attempt = (attempts.filter(number=number) if number else attempts).order_by("-number").first()
    if attempt is None and number:
        raise ApiError("NoTaskError", f"Task {task.role}-{task.index} has no attempt {number}.")
    return attempt


@handler(Access.USER)
def _log(request: HttpRequest, username: str, name: str, role: str, index: str) -> HttpResponse:
    """Lines of one stream of a task's container after a cursor: pass `next`
    back as `after` to get what follows (the web log viewer polls this way)."""
    job = find_job(request, username, name)
    task = _task(job.pk, role, index)
    stream_name = request.GET.get("stream", "stdout")
    if stream_name not in STREAMS:
        raise invalid(f"stream must be one of {', '.join(STREAMS)}, got {stream_name!r}.")
    after = int_param(request.GET, "after", default=-1, minimum=-1, maximum=2**31)
    limit = int_param(request.GET, "limit", default=1000, minimum=1, maximum=MAX_LINES)
    attempt = _asked_attempt(request, task)
    if attempt is None:
        return ok({"attempt": None, "taskState": "WAITING", "stream": stream_name, "lines": [], "next": after,
                   "more": False, "truncated": False})
    page = read_lines(attempt.pk, STREAMS[stream_name], after=after, limit=limit)
    rows = page.lines
    return ok({
        "attempt": attempt.number,
        "taskState": serializers.API_TASK_STATE.get(attempt.state, attempt.state),
        "stream": stream_name,
        "lines": [text for _seq, text in rows],
        "next": rows[-1][0] if rows else after,
        "more": page.more,
        "truncated": page.truncated,
    })


ssh = resource(GET=_ssh)
ssh_key = resource(GET=_ssh_key)
task_log = resource(GET=_log)
