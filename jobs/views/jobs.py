"""Job pages: the list (with live rows and bulk stop), a job's page (with its
live summary and task tables), stopping, tags, and config downloads.

Logs have their own module (jobs/views/job_logs.py). Every view finds the
job through `Job.objects.visible_to`, so another user's job is a 404.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from jobs import services
from jobs.ids import parse_id
from jobs.models import ExitType, ImagePull, Job, JobAttempt, LogLine, State, Stream, Task, TaskAttempt, TaskState
from jobs.services import access, listing, pulls, tags, usage, usage_series
from jobs.services.storage_links import job_storage_links
from jobs.spec import TaskRoleSpec, protocol_of


def job_for_user(request: HttpRequest, job_id: int) -> Job:
    """The job if the user may see it (owner or admin), else a 404."""
    return get_object_or_404(Job.objects.visible_to(request.user).select_related("owner", "virtual_cluster"), pk=job_id)


# ------------------------------------------------------------------ the list


def _list_context(request: HttpRequest, *, with_count: bool = True) -> dict:
    filters = listing.filters_from(request.GET, viewer=request.user)
    page = listing.job_list_page(filters, viewer=request.user, number=listing.page_number(request.GET.get("page")),
                                 with_count=with_count)
    return {"filters": filters, "page": page, "jobs": page.jobs, "ALL_USERS": listing.ALL_USERS,
            "idle_jobs": usage.idle_job_ids(job.pk for job in page.jobs)}


@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    context = _list_context(request)
    context.update(listing.filter_choices(viewer=request.user))
    context["states"] = State.choices
    context["sorts"] = listing.SORTS
    return render(request, "jobs/list.html", context)


@require_GET
def job_list_rows(request: HttpRequest) -> HttpResponse:
    """The rows of the list page as it is filtered now; the page polls this
    to keep statuses fresh without a reload."""
    return render(request, "jobs/partials/list_rows.html", _list_context(request, with_count=False))


def _safe_next(request: HttpRequest, default: str) -> str:
    # The page sends its own path. Anything not starting with "/" is refused
    # too: redirect() would take a bare word ("jobs") for a URL name to reverse.
    target = request.POST.get("next") or ""
    if target.startswith("/") and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return default


@require_POST
def bulk_stop(request: HttpRequest) -> HttpResponse:
    """Stop the selected jobs, each checked on its own; say what happened to each."""
    ids = [i for i in map(parse_id, request.POST.getlist("job")) if i is not None][:500]
    if not ids:
        messages.info(request, "Select the jobs to stop first (the boxes in the first column).")
    found = {job.pk: job for job in Job.objects.visible_to(request.user).filter(pk__in=ids)}
    for job_id in ids:
        job = found.get(job_id)
        if job is None:
            messages.error(request, f"Job #{job_id}: not found.")
            continue
        _stop_with_message(request, job)
    return redirect(_safe_next(request, reverse("jobs:list")))


def _stop_with_message(request: HttpRequest, job: Job) -> None:
    try:
        job = services.job_stop(job=job, by=request.user)
    except services.JobStateError as exc:
        messages.warning(request, f"{job.name}: not stopped, {exc}.")
        return
    if job.state == State.STOPPED:
        messages.success(request, f"{job.name}: stopped.")
    else:
        messages.success(request, f"{job.name}: stopping; its containers get a moment to exit.")


# ------------------------------------------------------------ a job's page


@dataclass(frozen=True)
class TaskRow:
    task: Task
    attempt: TaskAttempt | None
    ports: list[access.PortLink]
    gpus_simulated: bool
    pull: ImagePull | None = None  # its image's pull, while it waits on it or if it failed


@dataclass(frozen=True)
class RoleTable:
    role: TaskRoleSpec
    rows: list[TaskRow]


# The task tables show this many tasks a page. A job may hold 1,000 tasks,
# and the page polls its tables every 2 s: a page of rows costs the same
# whatever the job's size, and a state filter finds the few that failed.
TASK_PAGE_SIZE = 100
NOT_PLACED = "NOT_PLACED"  # the filter of tasks with no attempt in the shown job attempt


@dataclass(frozen=True)
class TaskListing:
    """The shown job attempt's tasks in the tables' order (roles as in the
    config, then index): (task id, role, index, attempt id or None, state
    or NOT_PLACED), read as plain tuples, not models."""

    rows: list[tuple[int, str, int, int | None, str]]

    def counts(self) -> Counter[str]:
        return Counter(row[4] for row in self.rows)


def _task_listing(job: Job, number: int) -> TaskListing:
    attempts = {task_id: (pk, state) for task_id, pk, state
                in job.task_attempts.filter(number=number).values_list("task_id", "pk", "state")}
    order = {role.name: position for position, role in enumerate(job.spec.task_roles)}
    tasks = sorted(job.tasks.values_list("pk", "role", "index"), key=lambda t: (order.get(t[1], len(order)), t[2]))
    return TaskListing([(pk, role, index, *attempts.get(pk, (None, NOT_PLACED))) for pk, role, index in tasks])


@dataclass(frozen=True)
class StateChoice:
    value: str  # "" for all
    label: str
    count: int


@dataclass(frozen=True)
class TaskPage:
    """Which of the listing's rows the tables show: the `state` filter's
    (or all), page `number` of `pages`."""

    state: str
    number: int
    pages: int
    first: int  # the first row's place among the filtered, from 1
    last: int
    total: int  # rows the filter keeps
    choices: list[StateChoice]
    task_ids: list[int]


def _task_page(listing: TaskListing, *, state: str, page: str) -> TaskPage:
    """Unknown states and page numbers fall back to all tasks and the
    nearest page: a link from an earlier attempt or a hand-typed URL still
    shows a table."""
    counts = listing.counts()
    labels = {**dict(TaskState.choices), NOT_PLACED: "not placed"}
    choices = [StateChoice("", "all", len(listing.rows))]
    choices += [StateChoice(value, labels[value], counts[value]) for value in labels if value in counts]
    if state not in counts:
        state = ""
    kept = [row for row in listing.rows if not state or row[4] == state]
    pages = max(1, -(-len(kept) // TASK_PAGE_SIZE))
    number = min(max(parse_id(page) or 1, 1), pages)
    shown = kept[(number - 1) * TASK_PAGE_SIZE:number * TASK_PAGE_SIZE]
    first = (number - 1) * TASK_PAGE_SIZE + 1 if shown else 0
    return TaskPage(state, number, pages, first, first + len(shown) - 1 if shown else 0, len(kept), choices,
                    [row[0] for row in shown])


def _role_tables(job: Job, page: TaskPage, attempts: list[TaskAttempt]) -> list[RoleTable]:
    """One table per task role, in the config's order, of the page's tasks
    and their attempts in the shown job attempt."""
    by_task = {a.task_id: a for a in attempts}
    shown_pulls = pulls.pulls_shown(by_task.values())
    tasks: dict[str, list[Task]] = {}
    for task in job.tasks.filter(pk__in=page.task_ids).order_by("role", "index"):  # through `job`: each task knows its job
        tasks.setdefault(task.role, []).append(task)
    tables = []
    for role in job.spec.task_roles:
        rows = []
        for task in tasks.get(role.name, []):
            attempt = by_task.get(task.pk)
            rows.append(TaskRow(task, attempt, access.port_links(attempt) if attempt else [],
                                bool(attempt and attempt.node and attempt.node.gpus_simulated),
                                shown_pulls.get(attempt.pk) if attempt else None))
        if rows:
            tables.append(RoleTable(role, rows))
    return tables


# The log viewer's task menu follows the task tables: the tasks of the page
# and filter they show, in the shown job attempt, then those tasks' attempts
# in the others, newest first, at most this many in all. A job may hold
# 1,000 tasks and 100 retries (101,000 task attempts), and the menu is drawn
# again with the tables every 2 s; another task's log is a page of the
# tables away (its stdout and stderr links open it here).
LOG_MENU_MAX = 300


@dataclass(frozen=True)
class LogChoice:
    pk: int
    task: str  # <role>-<index>
    state: str  # its label


def _log_choices(job: Job, number: int, listing: TaskListing, page: TaskPage,
                 opened: int | None = None) -> list[tuple[int, list[LogChoice]]]:
    """The log viewer's task menu: tasks grouped by job attempt, newest
    first; the shown attempt's in the tables' order, read as plain values.
    `opened`, the task attempt the viewer opens on, is offered wherever its
    task is, so that the menu names what the viewer shows."""
    labels = dict(TaskState.choices)
    on_page = set(page.task_ids)
    shown = [LogChoice(pk, f"{role}-{index}", labels[state])
             for task_id, role, index, pk, state in listing.rows if pk is not None and task_id in on_page][:LOG_MENU_MAX]
    groups: dict[int, list[LogChoice]] = {number: shown} if shown else {}
    others = (job.task_attempts.exclude(number=number).filter(task_id__in=page.task_ids)
              .order_by("-number", "task__role", "task__index")
              .values_list("pk", "number", "task__role", "task__index", "state")[:max(0, LOG_MENU_MAX - len(shown))])
    rows = list(others)
    if opened is not None and all(row[0] != opened for row in rows) and all(c.pk != opened for c in shown):
        rows += job.task_attempts.filter(pk=opened).values_list("pk", "number", "task__role", "task__index", "state")
    for pk, other, role, index, state in rows:
        groups.setdefault(other, []).append(LogChoice(pk, f"{role}-{index}", labels[state]))
    return sorted(groups.items(), key=lambda group: -group[0])


def _shown_attempt_number(request: HttpRequest, job: Job, job_attempts: list[JobAttempt]) -> int:
    raw = request.GET.get("attempt", "")
    numbers = {a.number for a in job_attempts}
    if parse_id(raw) in numbers:
        return int(raw)
    return job.attempt_number


def _tasks_query(*, attempt: int | None, state: str = "", page: int = 1) -> str:
    """The query string of a view of the task tables. Without `attempt` the
    page follows the job's newest attempt, as a retry starts."""
    params = {"attempt": attempt, "task_state": state, "tasks": page if page > 1 else None}
    kept = {name: value for name, value in params.items() if value}
    return f"?{urlencode(kept)}" if kept else ""


def _task_links(page: TaskPage, attempt: int | None) -> dict:
    """The tables' state filter and page links, and the live part's URL
    query, which keeps the same view."""
    def link(**changes: object) -> str:
        view: dict = {"attempt": attempt, "state": page.state, "page": page.number, **changes}
        return _tasks_query(**view)
    return {
        "states": [(choice, link(state=choice.value, page=1)) for choice in page.choices],
        "previous": link(page=page.number - 1) if page.number > 1 else "",
        "next": link(page=page.number + 1) if page.number < page.pages else "",
        "live": link(),
    }


def _detail_context(request: HttpRequest, job: Job, *, whole_page: bool = False) -> dict:
    """What the page's live parts show; with `whole_page`, also where the
    log viewer opens (the live parts keep what the viewer has open)."""
    job_attempts = list(job.attempts.all())
    number = _shown_attempt_number(request, job, job_attempts)
    listing = _task_listing(job, number)
    page = _task_page(listing, state=request.GET.get("task_state", ""), page=request.GET.get("tasks", ""))
    # Only the page's task attempts: a job may hold 1,000 tasks and a
    # hundred times as many attempts. Through `job` so each attempt's .job
    # is this job (the access cell reads it per row).
    shown = list(job.task_attempts.filter(number=number, task_id__in=page.task_ids)
                 .select_related("task", "node", "job_attempt"))
    tables = _role_tables(job, page, shown)
    waiting = job.state == State.WAITING
    log_attempt, log_stream = _log_start(request, job, listing) if whole_page else ("", "stdout")
    chosen = number if parse_id(request.GET.get("attempt", "")) == number else None
    return {
        "job": job,
        "job_attempts": job_attempts,
        "shown_number": number,
        "task_listing": listing,
        "task_page": page,
        "task_links": _task_links(page, chosen),
        "role_tables": tables,
        "task_access": access.tasks_access(job=job, attempts=shown, user=request.user),
        "log_groups": _log_choices(job, number, listing, page, opened=parse_id(log_attempt)),
        **_usage_menu_context(job, tables),
        "log_attempt": log_attempt,
        "log_stream": log_stream,
        "queue_position": services.queue_position(job) if waiting else None,
        "never_fits": services.never_fits_reason(job) if waiting else None,
        "starting_pulls": pulls.starting_pulls(job) if job.state == State.RUNNING and job.started_at is None else [],
        "can_stop": not job.is_final,
    }


@require_GET
def detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_for_user(request, job_id)
    context = _detail_context(request, job, whole_page=True)
    context["storage_links"] = job_storage_links(job=job, user=request.user)
    context["config_raw"] = job.config_raw  # a v2 job's YAML has its secrets masked when stored
    context["config_is_yaml"] = protocol_of(job.config_raw) == 2
    context["tags"] = list(job.tags.values_list("value", flat=True))
    context["can_tag"] = job.owner_id == request.user.pk
    context["config_normalized"] = json.dumps(job.spec.to_config(), indent=2, ensure_ascii=False)
    context["streams"] = [(s.label, s.label) for s in Stream]
    context.update(_usage_context(job))
    return render(request, "jobs/detail.html", context)


def _log_start(request: HttpRequest, job: Job, listing: TaskListing) -> tuple[str, str]:
    """The task attempt and stream the log viewer opens on: the URL's; for a
    job that failed, the failed task that ended it (its exit trigger; else
    its first failed task), on the stream that says why (the platform's note
    of a failed pull or launch, a traceback on stderr if the command wrote
    any); else the first task's stdout."""
    attempt, stream = request.GET.get("log", ""), request.GET.get("stream")
    # An id or nothing: the viewer's script looks it up with a CSS selector,
    # which a quote from a crafted link would break.
    attempt = attempt if parse_id(attempt) is not None else ""
    if attempt or stream in Stream.labels:
        return attempt, stream if stream in Stream.labels else "stdout"
    failures = [(role, index, pk) for _, role, index, pk, state in listing.rows if state == TaskState.FAILED]
    # With minFailedInstances over 1 the first failed task in role order
    # need not be the one whose failure ended the job.
    trigger = next((row for row in failures if row[:2] == (job.exit_trigger_role, job.exit_trigger_index)), None)
    failed = (trigger or failures[0])[2] if failures else None
    if job.state != State.FAILED or failed is None:
        return "", "stdout"
    if job.exit_type in (ExitType.IMAGE_PULL, ExitType.PLATFORM):
        return str(failed), "platform"
    wrote_stderr = (job.exit_type == ExitType.USER_EXIT
                    and LogLine.objects.filter(attempt_id=failed, stream=Stream.STDERR).exists())
    return str(failed), "stderr" if wrote_stderr else "stdout"


@dataclass(frozen=True)
class UsageChoice:
    """A task in the usage panel's menu of a big job's page."""

    role: str
    index: int
    attempt: int  # its job attempt's number, as the task's metrics take it
    state: str
    node: str
    idle_gpus: bool
    stalled: bool  # running, with no recent samples


def _usage_menu_context(job: Job, tables: list[RoleTable]) -> dict:
    """A big job's usage panel picks one task from a menu that, like the log
    viewer's, lists the tasks the tables show (their page and filter, at
    most TASK_PAGE_SIZE), refreshed with them: a menu of all 1,000 tasks came
    from a metrics answer of every task's samples (4.7 MB), polled. A small
    job's page draws every task and has no menu."""
    if not usage.job_wide_graphs(job.total_tasks):
        return {"usage_job_wide": False}
    attempts = [row.attempt for table in tables for row in table.rows if row.attempt is not None]
    idle = usage.idle_attempt_ids(a.pk for a in attempts)
    stalled = usage.stalled_attempt_ids([a.pk for a in attempts if a.state == TaskState.RUNNING])
    return {"usage_job_wide": True,
            "usage_choices": [UsageChoice(a.task.role, a.task.index, a.number, a.state, a.node_name, a.pk in idle,
                                          a.pk in stalled) for a in attempts]}


def _usage_context(job: Job) -> dict:
    """What the usage panel needs; its graphs read the REST API (v2 .../metrics)."""
    names = {"username": job.owner.username, "name": job.name}
    return {
        "usage_metrics_url": reverse("api-v2:job_metrics", kwargs=names),
        # One task's samples (up to usage.MAX_SAMPLES) when a big job's page
        # shows it: ROLE and INDEX are filled in by the script.
        "usage_task_metrics_url": reverse("api-v2:task_metrics", kwargs={**names, "role": "ROLE", "index": "INDEX"}),
        # The job-wide graphs' menu offers windows up to this (seconds).
        "usage_max_window": usage_series.max_window_seconds(),
        "usage_sample_seconds": usage.sample_seconds(),
        "usage_simulated_gpus": job.task_attempts.filter(number=job.attempt_number, node__gpus_simulated=True)
        .exclude(gpus=[]).exists(),
        **_idle_context(usage.idle_tasks_of(job)),
    }


def _idle_context(idle: list[usage.IdleTask]) -> dict:
    """A notice per task whose GPUs idle, or one for them all past a few."""
    summary = usage.idle_summary(idle)
    return {"usage_idle_tasks": [] if summary else idle, "usage_idle_summary": summary}


@require_GET
def detail_live(request: HttpRequest, job_id: int) -> HttpResponse:
    """The parts of a job's page that change while it runs (summary, task
    tables, the log viewer's task menu), polled by the page."""
    job = job_for_user(request, job_id)
    return render(request, "jobs/partials/job_live.html", _detail_context(request, job))


@require_http_methods(["GET", "POST"])
def stop(request: HttpRequest, job_id: int) -> HttpResponse:
    """GET asks for confirmation (the page's dialog does it in place); POST stops."""
    job = job_for_user(request, job_id)
    if request.method == "POST":
        _stop_with_message(request, job)
        return redirect("jobs:detail", job_id=job.pk)
    if job.is_final:
        messages.info(request, f"{job.name} has already ended ({job.get_state_display()}).")
        return redirect("jobs:detail", job_id=job.pk)
    return render(request, "jobs/stop_confirm.html", {"job": job})


# ---------------------------------------------------------------------- tags


def _owned_job(request: HttpRequest, job_id: int) -> Job:
    """The job if it is the user's own (tags are the owner's, as in REST v2), else a 404."""
    return get_object_or_404(Job, pk=job_id, owner=request.user)


@require_POST
def tag_add(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _owned_job(request, job_id)
    value = request.POST.get("tag", "").strip()
    try:
        added = tags.job_tag_add(job=job, value=value)
    except services.SubmitError as exc:
        messages.error(request, f"Tag not added: {exc.message}.")
    else:
        messages.success(request, f'Tagged "{value}".' if added else f'{job.name} already has the tag "{value}".')
    return redirect(reverse("jobs:detail", args=[job.pk]) + "#tags")


@require_POST
def tag_remove(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _owned_job(request, job_id)
    value = request.POST.get("tag", "")
    try:
        removed = tags.job_tag_remove(job=job, value=value)
    except services.SubmitError as exc:
        messages.error(request, f"Tag not removed: {exc.message}.")
    else:
        messages.success(request, f'Removed the tag "{value}".' if removed else f'{job.name} has no tag "{value}".')
    return redirect(reverse("jobs:detail", args=[job.pk]) + "#tags")


def _is_plain_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@require_GET
def config_download(request: HttpRequest, job_id: int, kind: str) -> HttpResponse:
    """The config as submitted (comments kept) or as normalized, as a file."""
    job = job_for_user(request, job_id)
    content_type = "application/json; charset=utf-8"
    if kind == "submitted" and protocol_of(job.config_raw) == 2:  # v2 YAML, its secrets masked when stored
        body, filename, content_type = job.config_raw, f"{job.name}.yaml", "text/yaml; charset=utf-8"
    elif kind == "submitted":
        body = job.config_raw
        filename = f"{job.name}.json" if _is_plain_json(body) else f"{job.name}.jsonc"
    elif kind == "normalized":
        body = json.dumps(job.spec.to_config(), indent=2, ensure_ascii=False) + "\n"
        filename = f"{job.name}.json"
    else:
        raise Http404("no such config")
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
