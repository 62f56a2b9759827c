"""Task logs: Docker log entries become ordered lines per stream, written to
the database in batches together with a resume cursor; pages and the API
read them after a cursor.

Why a cursor of (Docker timestamp, count): Docker stamps every log entry with
nanoseconds, so "everything after the last stored entry" can be asked again
after a node agent restarts, and entries sharing one timestamp are told apart
by how many of them were already stored. The cursor is written in the same
transaction as the lines it covers: no line is lost, none is stored twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Max
from django.utils import timezone

from jobs.models import LogCursor, LogLine, Stream, TaskAttempt

log = logging.getLogger(__name__)


def _clean(payload: bytes) -> str:
    """Bytes to storable text: invalid UTF-8 and NUL become U+FFFD."""
    return payload.decode("utf-8", "replace").replace("\x00", "\ufffd")


class LineAssembler:
    """Complete lines out of one stream's entries, with the cursor after each.

    Docker splits lines longer than 16 KB into several entries (only the last
    ends in a newline), so entries are joined until a newline arrives.
    """

    def __init__(self, *, last_ts_ns: int = 0, count_at_ts: int = 0, max_line_chars: int = 65536) -> None:
        self._resume_ts = last_ts_ns
        self._to_skip = count_at_ts
        self._ts = last_ts_ns
        self._count = count_at_ts
        self._partial: list[bytes] = []
        self._max = max_line_chars
        self.cursor = (last_ts_ns, count_at_ts)

    def already_stored(self, ts_ns: int) -> bool:
        if ts_ns < self._resume_ts:
            return True
        if ts_ns == self._resume_ts and self._to_skip > 0:
            self._to_skip -= 1
            return True
        return False

    def feed(self, ts_ns: int, payload: bytes) -> list[str]:
        if ts_ns == self._ts:
            self._count += 1
        else:
            self._ts, self._count = ts_ns, 1
        self._partial.append(payload)
        if not payload.endswith(b"\n"):
            return []
        return self._complete()

    def finish(self) -> list[str]:
        """The last line of a stream that ended without a newline."""
        return self._complete() if self._partial else []

    def _complete(self) -> list[str]:
        text = _clean(b"".join(self._partial))
        self._partial.clear()
        if text.endswith("\n"):
            text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
        self.cursor = (self._ts, self._count)
        if len(text) <= self._max:
            return [text]
        return [text[i : i + self._max] for i in range(0, len(text), self._max)]


@dataclass
class _StreamState:
    next_seq: int
    bytes_stored: int
    truncated: bool
    cursor: tuple[int, int]


@dataclass
class _Batch:
    attempt_id: int
    stream: int
    lines: list[str]
    cursor: tuple[int, int]


class LogWriter:
    """One thread per node agent that writes every task's lines in batches."""

    def __init__(self, *, flush_seconds: float | None = None, max_bytes: int | None = None) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._flush_seconds = flush_seconds if flush_seconds is not None else settings.LOG_FLUSH_SECONDS
        self._max_bytes = max_bytes if max_bytes is not None else settings.LOG_MAX_BYTES_PER_TASK
        self._states: dict[tuple[int, int], _StreamState] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._stopping = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.barrier(timeout=30)
        self._stopping.set()
        self._queue.put(None)
        self._thread.join(timeout=10)

    def open(self, attempt_id: int, stream: int) -> LogCursor:
        """The stored cursor of a stream (made if missing), before following it."""
        cursor, _ = LogCursor.objects.get_or_create(attempt_id=attempt_id, stream=stream)
        with self._lock:
            self._states[(attempt_id, stream)] = _StreamState(
                cursor.next_seq, cursor.bytes_stored, cursor.truncated, (cursor.last_ts_ns, cursor.count_at_ts)
            )
        return cursor

    def truncated(self, attempt_id: int, stream: int) -> bool:
        with self._lock:
            state = self._states.get((attempt_id, stream))
            return bool(state and state.truncated)

    def add(self, attempt_id: int, stream: int, lines: list[str], cursor: tuple[int, int]) -> None:
        if lines:
            self._queue.put(_Batch(attempt_id, stream, lines, cursor))

    def barrier(self, timeout: float = 30.0) -> bool:
        """Wait until every line handed over so far is committed."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def forget(self, attempt_id: int) -> None:
        with self._lock:
            for stream in Stream.values:
                self._states.pop((attempt_id, stream), None)

    def _run(self) -> None:
        while not self._stopping.is_set():
            item = self._queue.get()
            if item is None:
                break
            batches: list[_Batch] = []
            events: list[threading.Event] = []
            deadline = time.monotonic() + self._flush_seconds
            while item is not None:
                (events if isinstance(item, threading.Event) else batches).append(item)
                if isinstance(item, threading.Event) or len(batches) > 5000:
                    break
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
            if item is None:
                self._stopping.set()
            self._write_with_retry(batches)
            for event in events:
                event.set()
        connection.close()

    def _write_with_retry(self, batches: list[_Batch]) -> None:
        for attempt in range(5):
            try:
                close_old_connections()
                self._write(batches)
                return
            except Exception:  # a locked or lost database: keep the lines, try again
                log.exception("writing %d log batches failed (try %d)", len(batches), attempt + 1)
                connection.close()
                time.sleep(0.5 * (attempt + 1))

    def _write(self, batches: list[_Batch]) -> None:
        rows: list[LogLine] = []
        touched: dict[tuple[int, int], _StreamState] = {}
        with self._lock:
            states = {key: _StreamState(**vars(state)) for key, state in self._states.items()}
        for batch in batches:
            key = (batch.attempt_id, batch.stream)
            state = states.get(key)
            if state is None or state.truncated:
                continue
            for line in batch.lines:
                size = len(line.encode("utf-8")) + 1
                if state.bytes_stored + size > self._max_bytes:
                    limit_mb = self._max_bytes / (1024 * 1024)
                    rows.append(LogLine(attempt_id=batch.attempt_id, stream=batch.stream, seq=state.next_seq,
                                        text=f"[log truncated: this stream passed the {limit_mb:g} MB limit per task; "
                                             "later output is not stored. The task keeps running.]"))
                    state.next_seq += 1
                    state.truncated = True
                    break
                rows.append(LogLine(attempt_id=batch.attempt_id, stream=batch.stream, seq=state.next_seq, text=line))
                state.next_seq += 1
                state.bytes_stored += size
            state.cursor = batch.cursor
            touched[key] = state
        if not touched:
            return
        now = timezone.now()
        with transaction.atomic():
            LogLine.objects.bulk_create(rows, batch_size=1000)
            for (attempt_id, stream), state in touched.items():
                LogCursor.objects.filter(attempt_id=attempt_id, stream=stream).update(
                    next_seq=state.next_seq, bytes_stored=state.bytes_stored, truncated=state.truncated,
                    last_ts_ns=state.cursor[0], count_at_ts=state.cursor[1],
                )
            TaskAttempt.objects.filter(pk__in={a for a, _s in touched}).update(last_activity_at=now)
        with self._lock:
            for key, state in touched.items():
                if key in self._states:
                    self._states[key] = state


def write_note(attempt_id: int, text: str) -> None:
    """A platform message (image pulled, code staged ...) on the task's
    "platform" stream, kept apart from what the command printed."""
    with transaction.atomic():
        LogLine.objects.create(attempt_id=attempt_id, stream=Stream.PLATFORM, seq=last_seq(attempt_id, Stream.PLATFORM) + 1,
                               text=f"{timezone.now():%Y-%m-%d %H:%M:%S}Z {text}")


# ------------------------------------------------------------------ reading


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
