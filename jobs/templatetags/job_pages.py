"""Small formatting helpers for the job and cluster pages.

Times are rendered as <time datetime="ISO"> with a UTC fallback text;
static/jobs/portal.js rewrites them in the reader's own time zone. Durations
carry their start and end so the page can keep a running one ticking without
asking the server.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django import template
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from jobs.models import ExitType, Job, JobAttempt, TaskAttempt

register = template.Library()


@register.simple_tag
def local_time(moment: datetime | None, empty: str = "—") -> str:
    if moment is None:
        return format_html('<span class="muted">{}</span>', empty)
    utc = moment.astimezone(dt_timezone.utc)
    return format_html('<time datetime="{}">{} UTC</time>', utc.isoformat(), utc.strftime("%Y-%m-%d %H:%M:%S"))


@register.filter
def duration_text(value: timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = max(0, int(value.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


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


@register.filter
def mb(value: float | int | None) -> str:
    """Memory in MB as people read it."""
    if value is None:
        return "—"
    if value >= 1024:
        return f"{value / 1024:.1f} GB".replace(".0 GB", " GB")
    return f"{value:.0f} MB"


@register.filter
def num(value: float | int | None) -> str:
    """A resource amount: whole numbers without decimals, others with one."""
    if value is None:
        return "—"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


@register.filter
def percent_of(used: float, total: float) -> int:
    if not total:
        return 0
    return max(0, min(100, round(100 * used / total)))


@register.filter
def exit_words(item: Job | JobAttempt | TaskAttempt) -> str:
    """An ended job, attempt or task's outcome in words: what happened, the
    exit code when it means something, and the recorded reason."""
    if not item.exit_type and not item.exit_reason:
        return ""
    words = ExitType(item.exit_type).label if item.exit_type else ""
    if item.exit_type == ExitType.SUCCEEDED:
        words = "completed successfully"
    if item.exit_code not in (None, 0) or item.exit_type == ExitType.USER_EXIT:
        words += f" (exit code {item.exit_code})"
    reason = (item.exit_reason or "").strip()
    if reason and reason.lower() not in words.lower():
        words = f"{words}: {reason}" if words else reason
    return words[:1].upper() + words[1:]


@register.filter
def short_id(container_id: str) -> str:
    return container_id[:12]


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
