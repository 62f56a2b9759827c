"""Small formatting helpers for the job and cluster pages.

The words themselves (sizes, durations, outcomes) are jobs/formatting.py's,
registered here as filters. Times are rendered as <time datetime="ISO"> with
a UTC fallback text; static/jobs/portal.js rewrites them in the reader's own time zone. Durations
carry their start and end so the page can keep a running one ticking without
asking the server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from jobs import formatting
from jobs.formatting import duration_text

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
