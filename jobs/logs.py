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


# The most text one page of lines holds (and a little more: always one
# line). A line may be LOG_MAX_LINE_CHARS (64K) long: a tail poll of 1,000
# such lines, or an API page of 5,000, was tens of MB for a worker to hold.
PAGE_CHARS = 1024 * 1024
# Lines read per query for a page: with 64K lines, a batch stays a few MB.
_PAGE_BATCH = 100


@dataclass(frozen=True)
class LogPage:
    lines: list[tuple[int, str]]
    next_cursor: int  # pass as `after` to get what follows
    truncated: bool
    more: bool = False  # lines after next_cursor were left for the next page


def last_seq(attempt_id: int, stream: int) -> int:
    """The seq of a stream's last stored line, -1 when it has none. One step
    down the (attempt, stream, seq) unique index, however long the log."""
    last = LogLine.objects.filter(attempt_id=attempt_id, stream=stream).aggregate(m=Max("seq"))["m"]
    return -1 if last is None else last


def read_lines(attempt_id: int, stream: int, *, after: int = -1, limit: int = 1000,
               max_chars: int = PAGE_CHARS) -> LogPage:
    """Up to `limit` lines after `after`, and about `max_chars` of text at
    most (always at least one line), read _PAGE_BATCH at a time."""
    stored = LogLine.objects.filter(attempt_id=attempt_id, stream=stream).order_by("seq").values_list("seq", "text")
    rows: list[tuple[int, str]] = []
    size, cursor, more = 0, after, False
    while not more:
        want = min(_PAGE_BATCH, limit - len(rows) + 1)  # one past the limit tells whether there is more
        batch = list(stored.filter(seq__gt=cursor)[:want])
        for seq, text in batch:
            if len(rows) == limit or (rows and size + len(text) > max_chars):
                more = True
                break
            rows.append((seq, text))
            size, cursor = size + len(text), seq
        if len(batch) < want:
            break
    truncated = LogCursor.objects.filter(attempt_id=attempt_id, stream=stream, truncated=True).exists()
    return LogPage(lines=rows, next_cursor=cursor, truncated=truncated, more=more)


def search_lines(attempt_id: int, stream: int, query: str, *, limit: int = 200) -> list[tuple[int, str]]:
    """Lines holding `query` (case-insensitive), over the whole stored log."""
    if not query:
        return []
    return list(
        LogLine.objects.filter(attempt_id=attempt_id, stream=stream, text__icontains=query)
        .order_by("seq").values_list("seq", "text")[:limit]
    )


def iter_text(attempt_id: int, stream: int) -> Iterator[str]:
    """The whole log as text, a page at a time (for downloads)."""
    after = -1
    while True:
        page = read_lines(attempt_id, stream, after=after, limit=2000)
        if not page.lines:
            return
        after = page.next_cursor
        yield "".join(text + "\n" for _seq, text in page.lines)
