"""Task logs on the node: engine log entries become ordered lines per
stream, written to the database in batches together with a resume cursor.
(Pages and the API read them with jobs/logs.py.)

Why a cursor of (engine timestamp, count): the engine stamps every log entry
with nanoseconds, so "everything after the last stored entry" can be asked
again after a node agent restarts, and entries sharing one timestamp are
told apart by how many of them were already stored. The cursor is written in
the same transaction as the lines it covers: no line is lost, none is stored
twice.

Platform notes ("pulling image", "staged codeDir" ...) go through the same
writer on their own stream, numbered from the writer's memory and a cursor
row like the other streams, so two notes never race for a number.

Two limits, each ending in a marker line (the task keeps running): per
task attempt and stream, LOG_MAX_BYTES_PER_TASK; per job, over all its
tasks, streams and attempts, LOG_MAX_BYTES_PER_JOB and LOG_MAX_ROWS_PER_JOB
(rows too: an empty line is one byte but a whole database row). A job's
totals are the sums of its cursor rows, read in the transaction that adds
to them, with the job's row locked, so agents on several nodes writing for
one job count the same totals.

Held in memory, the lines handed over and not yet written are bounded by
LOG_WRITER_QUEUE_BYTES: while the database is away (the writer tries again
for as long as it is), the log follower asks `has_room` before each read and
reads nothing more while the writer is full. The engine keeps those lines
(json-file logs) and they are read once there is room again, so none is
lost and memory does not grow. Adding never waits: the follower's one
thread must go on with its timers and new streams, and notes and barriers
(the runner's, the watchers') are never held up by a full writer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction
from django.db.models import Sum

from jobs import services
from jobs.logs import last_seq
from jobs.models import Job, LogCursor, LogLine, Stream, TaskAttempt
from jobs.services import db_clock

log = logging.getLogger(__name__)
MB = 1024 * 1024
# What a queued line costs besides its text: a str object's header and a
# list slot. Counted so that a flood of short lines is bounded too.
_LINE_OVERHEAD = 64


def _size(size: int) -> str:
    return f"{size / MB:g} MB" if size >= MB else f"{size} bytes"


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
        self._partial_bytes = 0
        self._stored_early = False  # some of the line in _partial is stored already
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
        if not payload.endswith(b"\n"):
            self._partial.append(payload)
            self._partial_bytes += len(payload)
            return self._store_early() if self._partial_bytes >= self._max else []
        if self._partial:
            self._partial.append(payload)
            payload = b"".join(self._partial)
            self._partial.clear()
        return self._complete(payload)

    def finish(self) -> list[str]:
        """The last line of a stream that ended without a newline."""
        if not self._partial:
            return []
        payload = b"".join(self._partial)
        self._partial.clear()
        return self._complete(payload)

    def _store_early(self) -> list[str]:
        """A line that has no newline yet but is a row long already: its
        rows now, with the cursor after this entry. A task that never prints
        a newline (`yes | tr -d '\\n'`, a progress bar redrawn with \\r) would
        otherwise be held whole in the agent's memory, past every log limit.
        A character cut in two by the entry's end waits for its other half
        (lost only if the agent restarts right here)."""
        data = b"".join(self._partial)
        end = _whole_utf8_end(data)
        self._partial = [data[end:]] if end < len(data) else []
        self._partial_bytes = len(data) - end
        self._stored_early = True
        self.cursor = (self._ts, self._count)
        return self._rows(_clean(data[:end]))

    def _complete(self, payload: bytes) -> list[str]:
        text = _clean(payload)
        if text.endswith("\n"):
            text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
        self.cursor = (self._ts, self._count)
        stored_early, self._stored_early, self._partial_bytes = self._stored_early, False, 0
        if not text and stored_early:
            return []  # the newline after a line stored early: no empty row of its own
        return self._rows(text)

    def _rows(self, text: str) -> list[str]:
        if len(text) <= self._max:
            return [text]
        return [text[i : i + self._max] for i in range(0, len(text), self._max)]


def _whole_utf8_end(data: bytes) -> int:
    """Where `data` stops holding whole UTF-8 characters: before a last
    one that is cut short, else its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: where the last character starts
            length = 1 if byte < 0xC0 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4 if byte < 0xF8 else 1
            return len(data) - back if length > back else len(data)
    return len(data)


_Row = tuple[int, int, int, str]  # a LogLine's attempt_id, stream, seq, text


def _insert_lines(rows: list[_Row]) -> None:
    """Insert log rows with one prepared statement: a task printing as fast
    as it can gives hundreds of thousands of lines a minute, and making a
    model object per line (bulk_create) costs several times the insert."""
    table = connection.ops.quote_name(LogLine._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(name) for name in ("attempt_id", "stream", "seq", "text"))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 5000):
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s)", rows[start:start + 5000])


@dataclass
class _StreamState:
    next_seq: int
    bytes_stored: int
    truncated: bool
    cursor: tuple[int, int]


@dataclass
class _JobRoom:
    """What a job may still store, over all its tasks (one per job and write)."""

    bytes: int
    rows: int


@dataclass
class _Batch:
    attempt_id: int
    stream: int
    lines: list[str]
    cursor: tuple[int, int]
    size: int  # what it holds in memory, toward LOG_WRITER_QUEUE_BYTES


@dataclass
class _Note:
    attempt_id: int
    text: str  # stamped with the moment it was handed over


class LogWriter:
    """One thread per node agent that writes every task's lines in batches."""

    def __init__(self, *, flush_seconds: float | None = None, max_bytes: int | None = None,
                 max_job_bytes: int | None = None, max_job_rows: int | None = None,
                 queue_bytes: int | None = None) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._queue_bytes = queue_bytes if queue_bytes is not None else settings.LOG_WRITER_QUEUE_BYTES
        self._held = 0  # the size of the batches handed over and not yet written (queued or being written)
        self._room_lock = threading.Lock()  # over _held and _waiting only: never held while waiting
        self._waiting: list[Callable[[], None]] = []  # to call once there is room again
        self._flush_seconds = flush_seconds if flush_seconds is not None else settings.LOG_FLUSH_SECONDS
        self._max_bytes = max_bytes if max_bytes is not None else settings.LOG_MAX_BYTES_PER_TASK
        self._max_job_bytes = max_job_bytes if max_job_bytes is not None else settings.LOG_MAX_BYTES_PER_JOB
        self._max_job_rows = max_job_rows if max_job_rows is not None else settings.LOG_MAX_ROWS_PER_JOB
        self._states: dict[tuple[int, int], _StreamState] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._stopping = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return  # never started, or stopped already: nothing queued will be written
        self.barrier(timeout=30)
        self._stopping.set()
        self._queue.put(None)
        self._thread.join(timeout=10)

    def open(self, attempt_id: int, stream: int) -> LogCursor:
        """The stored cursor of a stream (made if missing), before following it."""
        with self._lock:
            followed_before = (attempt_id, stream) in self._states
        if followed_before:
            # Followed again (a watcher replaced): lines its follower handed
            # over may still wait here, and the cursor read below must come
            # after them, or the new follower stores them a second time.
            self.barrier()
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
        """Hand over a stream's lines, with the cursor after the last. Never
        waits: a reader that should wait while the writer is full asks
        `has_room` before it reads (the log follower does)."""
        if not lines:
            return
        # Counted per batch, not per line: a busy task's lines come in thousands.
        size = sum(map(len, lines)) + _LINE_OVERHEAD * len(lines)
        with self._room_lock:
            self._held += size
        self._queue.put(_Batch(attempt_id, stream, lines, cursor, size))

    def has_room(self, wake: Callable[[], None]) -> bool:
        """Whether the lines handed over and not yet written hold less than
        LOG_WRITER_QUEUE_BYTES. If not, `wake()` is called once they do, on
        the writer's thread (it must not block). A stopped writer has no
        room and never wakes anyone: what a reader would read could not be
        stored, and the engine keeps it for the next agent."""
        if self._stopping.is_set():
            return False
        if self._held < self._queue_bytes:  # the usual case, without the lock (a stale "yes" costs one read)
            return True
        with self._room_lock:
            if self._held < self._queue_bytes:
                return True
            if wake not in self._waiting:
                self._waiting.append(wake)
            return False

    def _release(self, items: list[_Batch | _Note]) -> None:
        """Written (or given up on): their room is free, and who waits for it is told."""
        size = sum(item.size for item in items if isinstance(item, _Batch))
        with self._room_lock:
            self._held -= size
            if self._held >= self._queue_bytes or not self._waiting:
                return
            waiting, self._waiting = self._waiting, []
        for wake in waiting:
            try:
                wake()
            except Exception:
                log.exception("waking a reader of the log writer failed")

    def note(self, attempt_id: int, text: str) -> None:
        """A platform message (image pulled, code staged ...) on the task's
        "platform" stream, kept apart from what the command printed. Written
        with the next batch; `barrier()` waits for it like for lines. Taken
        at once however full the writer is (notes are few and short, and
        not counted toward its bound)."""
        self._queue.put(_Note(attempt_id, f"{db_clock.now():%Y-%m-%d %H:%M:%S}Z {text}"))

    def barrier(self, timeout: float = 30.0) -> bool:
        """Wait until every line and note handed over so far is committed."""
        if not self._thread.is_alive():
            return False  # nobody would ever answer
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def forget(self, attempt_id: int) -> None:
        """Drop a finished task's stream states. Call it after a barrier: a
        note still queued would read its stream's cursor row again and stay."""
        with self._lock:
            for stream in Stream.values:
                self._states.pop((attempt_id, stream), None)

    def _run(self) -> None:
        while not self._stopping.is_set():
            item = self._queue.get()
            if item is None:
                break
            items: list[_Batch | _Note] = []
            events: list[threading.Event] = []
            deadline = time.monotonic() + self._flush_seconds
            while item is not None:
                (events if isinstance(item, threading.Event) else items).append(item)
                if isinstance(item, threading.Event) or len(items) > 5000:
                    break
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
            if item is None:
                self._stopping.set()
            self._write_with_retry(items)
            self._release(items)
            for event in events:
                event.set()
        connection.close()

    def _write_with_retry(self, items: list[_Batch | _Note]) -> None:
        """Write `items`, trying again while the database cannot be reached
        (restarted, failed over, locked): lines given up on would be lost,
        since the engine is asked again only from the stored cursor, at an
        agent's start. A write the database refuses is given up after five
        tries, as is any once the writer stops (the next agent resumes from
        the stored cursors)."""
        tries = 0
        while True:
            try:
                close_old_connections()
                self._write(items)
                return
            except Exception as exc:  # a locked or lost database: keep the lines, try again
                tries += 1
                log.exception("writing %d log batches failed (try %d)", len(items), tries)
                connection.close()
                unreachable = isinstance(exc, (OperationalError, InterfaceError))
                if tries >= 5 and (not unreachable or self._stopping.is_set()):
                    return
                time.sleep(min(5.0, 0.5 * tries))
                if self._committed_after_all(items):
                    return
                items = self._of_live_attempts(items)

    def _committed_after_all(self, items: list[_Batch | _Note]) -> bool:
        """Whether a write of `items` whose commit we never heard back from
        (the connection dropped during COMMIT) went through after all: the
        cursor rows it writes in the same transaction are then ahead of our
        numbering. Its lines are stored; writing them again would store
        them twice, so our numbering is taken from those rows instead."""
        keys = {(item.attempt_id, Stream.PLATFORM if isinstance(item, _Note) else item.stream) for item in items}
        try:
            stored = list(LogCursor.objects.filter(attempt_id__in={attempt for attempt, _ in keys})
                          .values_list("attempt_id", "stream", "next_seq", "bytes_stored", "truncated",
                                       "last_ts_ns", "count_at_ts"))
        except Exception:
            connection.close()
            return False  # still away: try the write again, and ask again after it
        with self._lock:
            ahead = {(attempt, stream): _StreamState(next_seq, size, truncated, (ts, count))
                     for attempt, stream, next_seq, size, truncated, ts, count in stored
                     if (attempt, stream) in keys and (attempt, stream) in self._states
                     and next_seq > self._states[attempt, stream].next_seq}
            self._states.update(ahead)
        return bool(ahead)

    def _of_live_attempts(self, items: list[_Batch | _Note]) -> list[_Batch | _Note]:
        """A finished job may be deleted while a last note of it is queued;
        its rows would fail the whole batch on every try, so drop them."""
        try:
            live = set(TaskAttempt.objects.filter(pk__in={i.attempt_id for i in items}).values_list("pk", flat=True))
        except Exception:
            return items  # the database is still away: try again as it was
        return [i for i in items if i.attempt_id in live]

    def _write(self, items: list[_Batch | _Note]) -> None:
        rows: list[_Row] = []
        touched: dict[tuple[int, int], _StreamState] = {}
        # Copies of the streams this write touches only: a node follows
        # thousands of streams, and most write nothing in a given batch.
        keys = {(item.attempt_id, item.stream if isinstance(item, _Batch) else Stream.PLATFORM) for item in items}
        with self._lock:
            states = {key: _StreamState(**vars(self._states[key])) for key in keys if key in self._states}
        now = db_clock.now()
        with transaction.atomic():
            room = self._job_room({item.attempt_id for item in items if isinstance(item, _Batch)})
            for item in items:
                if isinstance(item, _Note):
                    key = (item.attempt_id, Stream.PLATFORM)
                    state = states.get(key)
                    if state is None:
                        state = states[key] = self._open_platform(item.attempt_id)
                    self._add_note(state, item, rows)
                else:
                    key = (item.attempt_id, item.stream)
                    state = states.get(key)
                    if state is None or state.truncated:
                        continue
                    self._add_lines(state, item, rows, room.get(item.attempt_id))
                touched[key] = state
            if not touched:
                return
            _insert_lines(rows)
            for (attempt_id, stream), state in touched.items():
                LogCursor.objects.filter(attempt_id=attempt_id, stream=stream).update(
                    next_seq=state.next_seq, bytes_stored=state.bytes_stored, truncated=state.truncated,
                    last_ts_ns=state.cursor[0], count_at_ts=state.cursor[1],
                )
            # What the command printed is a sign of use; our own notes are not.
            services.attempts_note_activity({a for a, s in touched if s != Stream.PLATFORM}, now=now)
        with self._lock:
            for key, state in touched.items():
                if key in self._states:
                    self._states[key] = state

    def _job_room(self, attempt_ids: set[int]) -> dict[int, _JobRoom]:
        """Each attempt's job's room, one shared object per job. Runs in the
        write's transaction: the job rows are locked (PostgreSQL; SQLite's
        IMMEDIATE transactions are serial anyway) before their totals are read."""
        if not attempt_ids:
            return {}
        job_of = dict(TaskAttempt.objects.filter(pk__in=attempt_ids).values_list("pk", "job_id"))
        list(Job.objects.select_for_update().filter(pk__in=set(job_of.values())).values_list("pk", flat=True))
        totals = (LogCursor.objects.filter(attempt__job_id__in=set(job_of.values())).values("attempt__job_id")
                  .annotate(stored=Sum("bytes_stored"), rows=Sum("next_seq")))
        rooms = {job: _JobRoom(self._max_job_bytes, self._max_job_rows) for job in job_of.values()}
        for total in totals:
            room = rooms[total["attempt__job_id"]]
            room.bytes -= total["stored"] or 0
            room.rows -= total["rows"] or 0
        return {attempt: rooms[job] for attempt, job in job_of.items()}

    def _open_platform(self, attempt_id: int) -> _StreamState:
        """The platform stream's state, from its cursor row (made if missing),
        so numbering goes on after an agent restart. Runs in the writer thread,
        which alone numbers notes."""
        cursor, _ = LogCursor.objects.get_or_create(
            attempt_id=attempt_id, stream=Stream.PLATFORM,
            # Notes written before notes had a cursor row: number after them.
            defaults={"next_seq": last_seq(attempt_id, Stream.PLATFORM) + 1},
        )
        state = _StreamState(cursor.next_seq, cursor.bytes_stored, cursor.truncated, (0, 0))
        with self._lock:
            self._states.setdefault((attempt_id, Stream.PLATFORM), state)
        return _StreamState(**vars(state))

    def _add_note(self, state: _StreamState, note: _Note, rows: list[_Row]) -> None:
        # Notes are ours, few and short: the size limit per task is for the command's output.
        rows.append((note.attempt_id, Stream.PLATFORM, state.next_seq, note.text))
        state.next_seq += 1
        state.bytes_stored += len(note.text.encode("utf-8")) + 1

    def _add_lines(self, state: _StreamState, batch: _Batch, rows: list[_Row], job: _JobRoom | None) -> None:
        if self._add_all_lines(state, batch, rows, job):
            return
        for line in batch.lines:
            # Bytes as stored, newline included; an ASCII line (isascii() is a
            # flag lookup) without encoding a copy of it.
            size = (len(line) if line.isascii() else len(line.encode("utf-8"))) + 1
            marker = None
            if state.bytes_stored + size > self._max_bytes:
                marker = (f"[log truncated: this stream passed the {self._max_bytes / MB:g} MB limit per task "
                          "(LOG_MAX_BYTES_PER_TASK); later output is not stored. The task keeps running.]")
            elif job is not None and (size > job.bytes or job.rows < 1):
                marker = (f"[log truncated: this job passed its limit of {self._max_job_rows} lines or "
                          f"{_size(self._max_job_bytes)} over all its tasks and attempts (LOG_MAX_ROWS_PER_JOB, "
                          "LOG_MAX_BYTES_PER_JOB); later output is not stored. The task keeps running.]")
            if marker is not None:
                rows.append((batch.attempt_id, batch.stream, state.next_seq, marker))
                state.next_seq += 1
                state.truncated = True
                break
            rows.append((batch.attempt_id, batch.stream, state.next_seq, line))
            state.next_seq += 1
            state.bytes_stored += size
            if job is not None:
                job.bytes -= size
                job.rows -= 1
        state.cursor = batch.cursor

    def _add_all_lines(self, state: _StreamState, batch: _Batch, rows: list[_Row], job: _JobRoom | None) -> bool:
        """The usual case in one step: ASCII lines that all fit in the
        stream's and the job's room are numbered and added without a check
        per line (a busy task's lines come in thousands). False, having
        added nothing, when the lines must be looked at one by one."""
        lines = batch.lines
        text = "\n".join(lines)
        if not lines or not text.isascii():
            return False
        size = len(text) + 1  # every line's bytes and newline
        if state.bytes_stored + size > self._max_bytes or (
                job is not None and (size > job.bytes or len(lines) > job.rows)):
            return False
        first = state.next_seq
        rows.extend(zip(repeat(batch.attempt_id), repeat(batch.stream), range(first, first + len(lines)), lines))
        state.next_seq = first + len(lines)
        state.bytes_stored += size
        if job is not None:
            job.bytes -= size
            job.rows -= len(lines)
        state.cursor = batch.cursor
        return True
