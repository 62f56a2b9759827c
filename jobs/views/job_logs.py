"""A task's logs on the job page: a live tail polled after a cursor, a search
over the whole stored log, and the full log as a file.

Lines live in the database (jobs/logs.py), so all of this keeps working
after the container is gone. Streams are named in URLs: stdout, stderr and
platform (what the portal did for the task: image pull, code staging ...).
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from jobs import logs
from jobs.models import FINAL_TASK_STATES, Job, Stream, TaskAttempt
from jobs.views.streaming import streaming_response

TAIL_LINES = 500  # what the viewer shows first: the end of the log
PAGE_LINES = 1000  # most lines one poll returns; the page asks again at once if there are more
SEARCH_RESULTS = 200


def _attempt_for_user(request: HttpRequest, job_id: int, attempt_id: int) -> TaskAttempt:
    """The task attempt of a job the user may see, in one query (the tail is
    polled every second); a 404 otherwise."""
    attempts = TaskAttempt.objects.select_related("task", "job").filter(job__in=Job.objects.visible_to(request.user))
    # job__pk, not job_id: Django checks an id past 64 bits against the
    # job's own id field (no match), but passes it through a foreign key
    # to SQLite, which cannot take it.
    return get_object_or_404(attempts, pk=attempt_id, job__pk=job_id)


def _stream(name: str) -> Stream:
    for stream in Stream:
        if stream.label == name:
            return stream
    raise Http404("no such log stream")


def _int_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "")
    try:
        return int(raw) if raw.strip() else None
    except ValueError:
        return None


@require_GET
def log_tail(request: HttpRequest, job_id: int, attempt_id: int, stream: str) -> HttpResponse:
    """Lines after `after` (a seq), or the last TAIL_LINES when `after` is
    missing, as HTML rows with the next cursor on the wrapper."""
    attempt = _attempt_for_user(request, job_id, attempt_id)
    kind = _stream(stream)
    after = _int_param(request, "after")
    if after is None:
        after = max(-1, logs.last_seq(attempt.pk, kind) - TAIL_LINES)
    after = max(-1, after)
    page = logs.read_lines(attempt.pk, kind, after=after, limit=PAGE_LINES)
    return render(request, "jobs/partials/log_lines.html", {
        "lines": [(seq + 1, seq, text) for seq, text in page.lines],
        "first_seq": page.lines[0][0] if page.lines else after + 1,
        "next_cursor": page.next_cursor,
        "more": page.more,
        "final": attempt.state in FINAL_TASK_STATES,
    })


@require_GET
def log_search(request: HttpRequest, job_id: int, attempt_id: int, stream: str) -> HttpResponse:
    """Lines holding the query anywhere in the stored log (not only on screen)."""
    attempt = _attempt_for_user(request, job_id, attempt_id)
    kind = _stream(stream)
    query = request.GET.get("q", "").strip()[:200]
    found = logs.search_lines(attempt.pk, kind, query, limit=SEARCH_RESULTS + 1) if query else []
    return render(request, "jobs/partials/log_search.html", {
        "query": query, "results": [(seq + 1, seq, text) for seq, text in found[:SEARCH_RESULTS]],
        "more": len(found) > SEARCH_RESULTS, "limit": SEARCH_RESULTS, "stream": kind.label,
    })


@require_GET
def log_download(request: HttpRequest, job_id: int, attempt_id: int, stream: str) -> HttpResponse:
    """The whole log as text, streamed a chunk at a time; `?inline=1` shows
    it in the browser instead of saving it. One of the user's limited open
    streams (a 429 past it), counted once the log is known to be theirs."""
    attempt = _attempt_for_user(request, job_id, attempt_id)
    kind = _stream(stream)
    name = f"{attempt.job.name}-{attempt.task.role}-{attempt.task.index}-attempt{attempt.number}.{kind.label}.log"
    disposition = "inline" if request.GET.get("inline") else "attachment"
    return streaming_response(request, logs.iter_text(attempt.pk, kind), content_type="text/plain; charset=utf-8",
                              headers={"Content-Disposition": f'{disposition}; filename="{name}"',
                                       "X-Content-Type-Options": "nosniff"})
