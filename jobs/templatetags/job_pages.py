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
from typing import Any

from django import template
from django.template.defaultfilters import date as date_filter
from django.template.defaulttags import querystring
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from jobs import formatting
from jobs.formatting import duration_text
from jobs.models import Job

register = template.Library()

register.filter("duration_text", formatting.duration_text)
register.filter("mb", formatting.mb)
register.filter("num", formatting.num)
register.filter("percent_of", formatting.percent_of)
register.filter("exit_words", formatting.exit_words)
register.filter("short_id", formatting.short_id)


@register.simple_tag
def local_time(moment: datetime | None, empty: str = "—") -> str:
    if moment is None:
        return format_html('<span class="muted">{}</span>', empty)
    utc = moment.astimezone(dt_timezone.utc)
    return format_html('<time datetime="{}">{} UTC</time>', utc.isoformat(), utc.strftime("%Y-%m-%d %H:%M:%S"))


@register.simple_tag
def duration(start: datetime | None, end: datetime | None = None) -> str:
    """The time from start to end (or to now, ticking in the browser)."""
    if start is None:
        return format_html('<span class="muted">{}</span>', "—")
    text = duration_text((end or timezone.now()) - start)
    if end is None:
        return format_html('<span class="duration" data-start="{}">{}</span>', start.isoformat(), text)
    return format_html('<span class="duration">{}</span>', text)


@register.simple_tag
def ago(moment: datetime | None) -> str:
    """'12 s ago', kept fresh by the browser."""
    if moment is None:
        return format_html('<span class="muted">{}</span>', "never")
    return format_html('<span class="ago" data-since="{}">{} ago</span>', moment.isoformat(), duration_text(timezone.now() - moment))


_IDLE_BADGE = mark_safe(
    """<span class="badge idle-gpus" title="A task's GPUs have stayed almost unused for a while">GPUs idle</span>""")


@register.simple_tag(takes_context=True)
def job_rows(context: template.Context, jobs: list[Job], idle_jobs: Mapping[int, datetime | None],
             tags: Mapping[int, list[str]]) -> str:
    """The job list's rows (jobs/partials/list_rows.html). Built here, not
    by a template loop: a list page has 50 rows of ten cells, and the
    template engine's lookups, filters and tags per cell took 15 of the
    rows fragment's 25 ms, which every open list page asks for again every
    few seconds (bench/job_list.py). Every value goes through format_html,
    so it is escaped as the template escaped it."""
    detail_url = _url_for_ids("jobs:detail")
    rows = [_job_row(context, job, idle_jobs, tags.get(job.pk, []), detail_url) for job in jobs]
    return mark_safe("\n".join(rows))  # each made by format_html


def _url_for_ids(name: str) -> Callable[[int], str]:
    """The URL `name` for any object id, from one reverse() (once per row
    it was a fifth of the rows' time)."""
    marker = 9876543210
    head, tail = reverse(name, args=[marker]).split(str(marker))
    return lambda pk: f"{head}{pk}{tail}"


def _job_row(context: template.Context, job: Job, idle_jobs: Mapping[int, datetime | None], tags: list[str],
             detail_url: Callable[[int], str]) -> str:
    check = "" if job.is_final else format_html(
        '<input type="checkbox" name="job" value="{}" aria-label="Select {}">', job.pk, job.name)
    return format_html(
        '<tr data-job-id="{}" data-state="{}">\n'
        '  <td class="check">{}</td>\n'
        '  <td class="name"><a href="{}">{}</a>{}</td>\n'
        "  <td>{}</td>\n  <td>{}</td>\n"
        '  <td><span class="badge {}">{}</span>{}</td>\n'
        '  <td class="nowrap">{}</td>\n  <td class="nowrap">{}</td>\n'
        '  <td class="num">{}</td>\n  <td class="num">{}</td>\n  <td class="num">{}</td>\n</tr>',
        job.pk, job.state, check, detail_url(job.pk), job.name, _tag_links(context, tags),
        job.owner.username, job.virtual_cluster.name, job.state, job.get_state_display(), _idle(job, idle_jobs),
        local_time(job.submitted_at), duration(job.started_at, job.finished_at),
        job.retries, job.total_tasks, job.total_gpus,
    )


def _tag_links(context: template.Context, tags: list[str]) -> str:
    if not tags:
        return ""
    links = format_html_join("", '<a class="tag" href="{}" title="Jobs tagged {}">{}</a>', (
        (querystring(context, tag=tag, page=None), tag, tag) for tag in tags))
    return format_html('<div class="job-tags-cell">{}</div>', links)


def _idle(job: Job, idle_jobs: Mapping[int, datetime | None]) -> str:
    """The GPUs-idle badge, and when the job will be stopped for it."""
    if job.pk not in idle_jobs:
        return ""
    stop_at = idle_jobs[job.pk]
    if not stop_at:
        return format_html(" {}", _IDLE_BADGE)
    return format_html(' {} <span class="small" data-idle-stop-at="{}">will be stopped at {}</span>',
                       _IDLE_BADGE, date_filter(stop_at, "c"), local_time(stop_at))


@register.simple_tag
def filter_options(names: Iterable[str], selected: str, skip: str = "") -> str:
    """The <option>s of a job list filter menu, `selected` marked, `skip`
    left out. A tag rather than a template loop: an admin's user menu lists
    every user, and a loop with two {% if %} per user was a fifth of the
    list page's rendering (bench/job_list.py)."""
    return format_html_join("", '<option value="{}"{}>{}</option>', (
        (name, " selected" if name == selected else "", name) for name in names if name != skip))


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
