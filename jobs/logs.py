"""Task logs, the reading half: pages and the API read stored lines after a
cursor (a line's seq), search them, or stream them whole.

Lines are written on the node, in batches with a resume cursor, by
jobs/node/logwriter.py; every stream numbers its lines 0, 1, 2 ... with no
gaps, so "the lines after seq N" is a cheap step down the unique index.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from django.db.models import Max

from jobs.models import LogCursor, LogLine


@dataclass(frozen=True)
class LogPage:
    lines: list[tuple[int, str]]
    next_cursor: int  # pass as `after` to get what follows
    truncated: bool


def last_seq(attempt_id: int, stream: int) -> int:
    """The seq of a stream's last stored line, -1 when it has none. One step
    down the (attempt, stream, seq) unique index, however long the log."""
    last = LogLine.objects.filter(attempt_id=attempt_id, stream=stream).aggregate(m=Max("seq"))["m"]
    return -1 if last is None else last


def read_lines(attempt_id: int, stream: int, *, after: int = -1, limit: int = 1000) -> LogPage:
    rows = list(
        LogLine.objects.filter(attempt_id=attempt_id, stream=stream, seq__gt=after)
        .order_by("seq").values_list("seq", "text")[:limit]
    )
    next_cursor = rows[-1][0] if rows else after
    truncated = LogCursor.objects.filter(attempt_id=attempt_id, stream=stream, truncated=True).exists()
    return LogPage(lines=rows, next_cursor=next_cursor, truncated=truncated)


def search_lines(attempt_id: int, stream: int, query: str, *, limit: int = 200) -> list[tuple[int, str]]:
    """Lines holding `query` (case-insensitive), over the whole stored log."""
    if not query:
        return []
    return list(
        LogLine.objects.filter(attempt_id=attempt_id, stream=stream, text__icontains=query)
        .order_by("seq").values_list("seq", "text")[:limit]
    )


def iter_text(attempt_id: int, stream: int, *, chunk: int = 2000) -> Iterator[str]:
    """The whole log as text, a chunk at a time (for downloads)."""
    after = -1
    while True:
        rows = list(
            LogLine.objects.filter(attempt_id=attempt_id, stream=stream, seq__gt=after)
            .order_by("seq").values_list("seq", "text")[:chunk]
        )
        if not rows:
            return
        after = rows[-1][0]
        yield "".join(text + "\n" for _seq, text in rows)
