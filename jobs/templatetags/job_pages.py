"""Small formatting helpers for the job and cluster pages.

The words themselves (sizes, durations, outcomes) are jobs/formatting.py's,
registered here as filters. Times are rendered as <time datetime="ISO"> with
a UTC fallback text; static/jobs/portal.js rewrites them in the reader's own time zone. Durations
carry their start and end so the page can keep a running one ticking without
asking the server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from datetime import timezone as dt_timezone
from html import escape as html_escape
from typing import Any

from django import template
from django.template.defaultfilters import date as date_filter
from django.template.defaulttags import querystring
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from jobs import exit_spec, formatting
from jobs.formatting import duration_text
from jobs.models import Job
from jobs.services.listing import JobRow

register = template.Library()

register.filter("duration_text", formatting.duration_text)
register.filter("mb", formatting.mb)
register.filter("num", formatting.num)
register.filter("percent_of", formatting.percent_of)
register.filter("exit_words", formatting.exit_words)
register.filter("exit_trigger_words", formatting.exit_trigger_words)
register.filter("attempt_trigger_line", formatting.attempt_trigger_line)
register.filter("short_id", formatting.short_id)


@register.filter
def exit_solution(job: Job) -> tuple[str, ...]:
    """What the user can do about how `job` ended (jobs/exit_spec.py)."""
    return exit_spec.solution_on_job_page(job.exit_type, retries=job.retries, retry_limit=job.retry_limit)


@register.simple_tag
def local_time(moment: datetime | None, empty: str = "—") -> str:
    return mark_safe(_time_html(moment, empty))


def _time_html(moment: datetime | None, empty: str = "—") -> str:
    if moment is None:
        return f'<span class="muted">{html_escape(empty)}</span>'
    utc = moment.astimezone(dt_timezone.utc)
    # isoformat() and strftime() of a datetime: digits and "-:+.T " only.
    return f'<time datetime="{utc.isoformat()}">{utc.strftime("%Y-%m-%d %H:%M:%S")} UTC</time>'


@register.simple_tag
def duration(start: datetime | None, end: datetime | None = None) -> str:
    """The time from start to end (or to now, ticking in the browser)."""
    return mark_safe(_duration_html(start, end))


def _duration_html(start: datetime | None, end: datetime | None) -> str:
    if start is None:
        return '<span class="muted">—</span>'
    text = duration_text((end or timezone.now()) - start)  # digits and d, h, m, s
    if end is None:
        return f'<span class="duration" data-start="{start.isoformat()}">{text}</span>'
    return f'<span class="duration">{text}</span>'


@register.simple_tag
def ago(moment: datetime | None) -> str:
    """'12 s ago', kept fresh by the browser."""
    if moment is None:
        return format_html('<span class="muted">{}</span>', "never")
    return format_html('<span class="ago" data-since="{}">{} ago</span>', moment.isoformat(), duration_text(timezone.now() - moment))


_IDLE_BADGE = mark_safe(
    """<span class="badge idle-gpus" title="A task's GPUs have stayed almost unused for a while">GPUs idle</span>""")


@register.simple_tag(takes_context=True)
def job_rows(context: template.Context, jobs: list[JobRow], idle_jobs: Mapping[int, datetime | None],
             tags: Mapping[int, list[str]]) -> str:
    """The job list's rows (jobs/partials/list_rows.html). Built here, not
    by a template loop: a list page has 50 rows of ten cells, and the
    template engine's lookups, filters and tags per cell took 15 of the
    rows fragment's 25 ms, which every open list page asks for again every
    few seconds (bench/job_list.py). Every text goes through html_escape,
    as the template escaped it; numbers and times are written by us."""
    detail_url = _url_for_ids("jobs:detail")
    rows = [_job_row(context, job, idle_jobs, tags.get(job.pk, []), detail_url) for job in jobs]
    return mark_safe("\n".join(rows))  # each escaped piece by piece


def _url_for_ids(name: str) -> Callable[[int], str]:
    """The URL `name` for any object id, from one reverse() (once per row
    it was a fifth of the rows' time)."""
    marker = 9876543210
    head, tail = reverse(name, args=[marker]).split(str(marker))
    return lambda pk: f"{head}{pk}{tail}"


def _job_row(context: template.Context, job: JobRow, idle_jobs: Mapping[int, datetime | None], tags: list[str],
             detail_url: Callable[[int], str]) -> str:
    # An f-string with the standard library's html.escape, the function behind
    # Django's escape: format_html's conditional_escape per value (a check for
    # lazy strings, a SafeString) was half of building a row.
    pk, name, state = job.pk, html_escape(job.name), html_escape(job.state)
    check = "" if job.is_final else f'<input type="checkbox" name="job" value="{pk}" aria-label="Select {name}">'
    return (
        f'<tr data-job-id="{pk}" data-state="{state}">\n'
        f'  <td class="check">{check}</td>\n'
        f'  <td class="name"><a href="{html_escape(detail_url(pk))}">{name}</a>{_tag_links(context, tags)}</td>\n'
        f"  <td>{html_escape(job.owner_username)}</td>\n  <td>{html_escape(job.vc_name)}</td>\n"
        f'  <td><span class="badge {state}">{html_escape(job.get_state_display())}</span>{_idle(job, idle_jobs)}</td>\n'
        f'  <td class="nowrap">{_time_html(job.submitted_at)}</td>\n'
        f'  <td class="nowrap">{_duration_html(job.started_at, job.finished_at)}</td>\n'
        f'  <td class="num">{int(job.retries)}</td>\n  <td class="num">{int(job.total_tasks)}</td>\n'
        f'  <td class="num">{int(job.total_gpus)}</td>\n</tr>'
    )


def _tag_links(context: template.Context, tags: list[str]) -> str:
    if not tags:
        return ""
    links = "".join(
        f'<a class="tag" href="{html_escape(querystring(context, tag=tag, page=None))}" title="Jobs tagged {html_escape(tag)}">'
        f"{html_escape(tag)}</a>" for tag in tags)
    return f'<div class="job-tags-cell">{links}</div>'


def _idle(job: JobRow, idle_jobs: Mapping[int, datetime | None]) -> str:
    """The GPUs-idle badge, and when the job will be stopped for it."""
    if job.pk not in idle_jobs:
        return ""
    stop_at = idle_jobs[job.pk]
    if not stop_at:
        return f" {_IDLE_BADGE}"
    return (f' {_IDLE_BADGE} <span class="small" data-idle-stop-at="{html_escape(date_filter(stop_at, "c"))}">'
            f"will be stopped at {_time_html(stop_at)}</span>")


@register.simple_tag
def filter_options(names: Iterable[str], selected: str, skip: str = "") -> str:
    """The <option>s of a job list filter menu, `selected` marked, `skip`
    left out. A tag rather than a template loop: an admin's user menu lists
    every user, and a loop with two {% if %} per user was a fifth of the
    list page's rendering (bench/job_list.py)."""
    return mark_safe("".join(
        f'<option value="{html_escape(name)}"{" selected" if name == selected else ""}>{html_escape(name)}</option>'
        for name in names if name != skip))


@register.filter
def get_item(mapping: Mapping[Any, Any] | None, key: Any) -> Any:
    """`mapping|get_item:key`: what the view put under `key`, or None."""
    return mapping.get(key) if mapping else None


@register.filter
def highlight(text: str, query: str) -> str:
    """`text` with each case-insensitive occurrence of `query` in <mark>."""
    if not query:
        return format_html("{}", text)
    parts = re.split(f"({re.escape(query)})", text, flags=re.IGNORECASE)
    return format_html_join(
        "", "{}", ((format_html("<mark>{}</mark>", p) if i % 2 else p,) for i, p in enumerate(parts))
    )


@register.simple_tag(takes_context=True)
def sort_header(context: template.Context, key: str, label: str, first: str = "asc") -> str:
    """A sortable column heading: a link that sorts by `key` (toggling the
    direction when it already does), keeping the other filters."""
    request = context["request"]
    current: str = context["filters"].sort
    active = current.lstrip("-") == key
    descending = current.startswith("-")
    if active:
        target = key if descending else f"-{key}"
    else:
        target = f"-{key}" if first == "desc" else key
    params = request.GET.copy()
    params["sort"] = target
    params.pop("page", None)
    sort_state = ("descending" if descending else "ascending") if active else ""
    arrow = ("▼" if descending else "▲") if active else "↕"
    return format_html(
        '<th scope="col" class="sortable{}"{}><a href="?{}">{}<span class="sort-arrow" aria-hidden="true">{}</span></a></th>',
        " sorted" if active else "", format_html(' aria-sort="{}"', sort_state) if active else "",
        params.urlencode(), label, arrow,
    )
