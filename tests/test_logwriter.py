"""The node's log writer at its seams: platform notes numbered from memory
and a cursor row (across an agent restart too), lines and notes durable
after a barrier, and the task state it moves through services
(last_activity_at forward only; the first SSH answer kept).

Real database, no engine: the writer is handed lines and notes directly.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.models import LogCursor, LogLine, Stream, Task, TaskAttempt, TaskState
from jobs.node.logwriter import LogWriter
from tests.helpers import log_writes_locked, rows_only_attempt


@pytest.fixture
def attempt(alice) -> TaskAttempt:
    return rows_only_attempt(alice, f"logwriter{alice.pk}")


@pytest.fixture
def writer():
    made: list[LogWriter] = []

    def make() -> LogWriter:
        made.append(LogWriter(flush_seconds=0.05))
        made[-1].start()
        return made[-1]

    yield make
    for one in made:
        one.stop()


def stored(attempt: TaskAttempt, stream: int) -> list[tuple[int, str]]:
    return list(LogLine.objects.filter(attempt=attempt, stream=stream).order_by("seq").values_list("seq", "text"))


def test_it_numbers_notes_on_after_an_agent_restart(attempt, writer):
    first = writer()
    first.note(attempt.pk, "pulling image busybox")
    first.note(attempt.pk, "pulled image busybox")
    assert first.barrier()
    first.stop()
    second = writer()  # a new agent process: nothing in memory
    second.note(attempt.pk, "staged codeDir")
    assert second.barrier()
    lines = stored(attempt, Stream.PLATFORM)
    assert [seq for seq, _text in lines] == [0, 1, 2]
    assert [text.split("Z ", 1)[1] for _seq, text in lines] == ["pulling image busybox", "pulled image busybox",
                                                               "staged codeDir"]
    assert LogCursor.objects.get(attempt=attempt, stream=Stream.PLATFORM).next_seq == 3


def test_it_numbers_notes_after_ones_stored_before_notes_had_a_cursor(attempt, writer):
    LogLine.objects.bulk_create([LogLine(attempt=attempt, stream=Stream.PLATFORM, seq=i, text=f"old {i}")
                                 for i in range(2)])
    one = writer()
    one.note(attempt.pk, "new")
    assert one.barrier()
    assert [seq for seq, _text in stored(attempt, Stream.PLATFORM)] == [0, 1, 2]


def test_it_gives_notes_from_many_threads_one_gapless_numbering(attempt, writer):
    one = writer()

    def send(name: str) -> None:
        for i in range(25):
            one.note(attempt.pk, f"{name} {i}")

    threads = [threading.Thread(target=send, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert one.barrier()
    lines = stored(attempt, Stream.PLATFORM)
    assert [seq for seq, _text in lines] == list(range(100))
    # Each sender's notes keep their order.
    texts = [text.split("Z ", 1)[1] for _seq, text in lines]
    assert [t for t in texts if t.startswith("t2 ")] == [f"t2 {i}" for i in range(25)]


def test_it_writes_lines_and_notes_of_one_task_apart(attempt, writer):
    one = writer()
    one.open(attempt.pk, Stream.STDOUT)
    one.add(attempt.pk, Stream.STDOUT, ["hello", "world"], (10, 1))
    one.note(attempt.pk, "a note")
    one.add(attempt.pk, Stream.STDOUT, ["again"], (11, 1))
    assert one.barrier()
    assert stored(attempt, Stream.STDOUT) == [(0, "hello"), (1, "world"), (2, "again")]
    assert [seq for seq, _text in stored(attempt, Stream.PLATFORM)] == [0]
    cursor = LogCursor.objects.get(attempt=attempt, stream=Stream.STDOUT)
    assert (cursor.next_seq, cursor.last_ts_ns, cursor.count_at_ts) == (3, 11, 1)


def test_it_counts_a_lines_bytes_as_utf_8_toward_the_limit(attempt):
    # "héllo" is 6 bytes and "日本" 6, each with its newline 7: 3 + 7 + 7 = 17
    # bytes fit a limit of 17, and the next line is over it.
    one = LogWriter(flush_seconds=0.05, max_bytes=17)
    one.start()
    try:
        one.open(attempt.pk, Stream.STDOUT)
        one.add(attempt.pk, Stream.STDOUT, ["ok", "héllo", "日本", "x"], (10, 1))
        assert one.barrier()
    finally:
        one.stop()
    texts = [text for _seq, text in stored(attempt, Stream.STDOUT)]
    assert texts[:3] == ["ok", "héllo", "日本"]
    assert len(texts) == 4 and texts[3].startswith("[log truncated")
    assert LogCursor.objects.get(attempt=attempt, stream=Stream.STDOUT).bytes_stored == 17


@pytest.mark.parametrize("limit", ["stream", "job bytes", "job lines"])
def test_a_batch_that_fits_is_stored_whole_and_the_next_one_up_to_the_limit(attempt, limit):
    # 4 + 5 bytes fit a limit of 10 (one step for the whole batch); of the
    # next batch "h" (2 bytes) does not, nor a third line for a job allowed 2.
    limits = {"stream": {"max_bytes": 10}, "job bytes": {"max_job_bytes": 10},
              "job lines": {"max_job_rows": 2}}[limit]
    one = LogWriter(flush_seconds=0.05, **limits)
    one.start()
    try:
        one.open(attempt.pk, Stream.STDOUT)
        one.add(attempt.pk, Stream.STDOUT, ["abc", "defg"], (10, 1))
        assert one.barrier()
        one.add(attempt.pk, Stream.STDOUT, ["h", "i"], (11, 1))
        assert one.barrier()
    finally:
        one.stop()
    got = stored(attempt, Stream.STDOUT)
    assert [seq for seq, _text in got] == [0, 1, 2]
    assert [text for _seq, text in got][:2] == ["abc", "defg"] and got[2][1].startswith("[log truncated")
    cursor = LogCursor.objects.get(attempt=attempt, stream=Stream.STDOUT)
    assert (cursor.next_seq, cursor.bytes_stored, cursor.truncated) == (3, 9, True)


def test_it_counts_output_as_activity_but_not_notes(attempt, writer):
    one = writer()
    one.note(attempt.pk, "pulling image")
    assert one.barrier()
    assert TaskAttempt.objects.get(pk=attempt.pk).last_activity_at is None
    one.open(attempt.pk, Stream.STDERR)
    one.add(attempt.pk, Stream.STDERR, ["a line"], (5, 1))
    assert one.barrier()
    assert TaskAttempt.objects.get(pk=attempt.pk).last_activity_at is not None


def test_it_only_moves_last_activity_forward(attempt):
    later = timezone.now() + timedelta(minutes=5)
    TaskAttempt.objects.filter(pk=attempt.pk).update(last_activity_at=later)
    assert services.attempts_note_activity({attempt.pk}, now=timezone.now()) == 0
    assert TaskAttempt.objects.get(pk=attempt.pk).last_activity_at == later
    assert services.attempts_note_activity({attempt.pk}, now=later + timedelta(seconds=1)) == 1
    assert services.attempts_note_activity(set(), now=later) == 0


def test_it_keeps_the_first_ssh_answer(attempt):
    assert services.attempt_set_ssh_available(attempt.pk, available=True)
    assert not services.attempt_set_ssh_available(attempt.pk, available=False)
    assert TaskAttempt.objects.get(pk=attempt.pk).ssh_available is True


def test_it_drops_a_deleted_tasks_notes_and_keeps_the_rest(attempt, alice, writer):
    task = Task.objects.create(job=attempt.job, role="main", index=1)
    other = TaskAttempt.objects.create(task=task, job_attempt=attempt.job_attempt, job=attempt.job, number=1,
                                       node_name="node-x", state=TaskState.SUCCEEDED)
    one = writer()
    one.open(attempt.pk, Stream.STDOUT)
    other_id = other.pk
    other.delete()  # its job was deleted while a last note of it was queued
    one.note(other_id, "kept for debugging")
    one.add(attempt.pk, Stream.STDOUT, ["still stored"], (7, 1))
    assert one.barrier(timeout=60)
    assert stored(attempt, Stream.STDOUT) == [(0, "still stored")]
    assert not LogLine.objects.filter(attempt_id=other_id).exists()


def test_a_stream_followed_again_resumes_after_the_lines_still_queued_for_it(attempt):
    # A watcher that failed is replaced by reconciliation while its lines
    # wait for the writer: the new follower's cursor, read before they were
    # committed, made it store them a second time.
    one = LogWriter(flush_seconds=30)  # nothing written before a barrier or a full batch
    one.start()
    try:
        one.open(attempt.pk, Stream.STDOUT)
        one.add(attempt.pk, Stream.STDOUT, ["first", "second"], (1_000, 2))
        again = one.open(attempt.pk, Stream.STDOUT)
        assert (again.last_ts_ns, again.count_at_ts, again.next_seq) == (1_000, 2, 2)
        assert stored(attempt, Stream.STDOUT) == [(0, "first"), (1, "second")]
    finally:
        one.stop()


def test_it_has_no_room_past_its_bound_until_what_it_holds_is_written(attempt):
    # Two lines of 500 characters hold 1000 bytes and 64 a line: past a
    # bound of 1000, and so until they are written, however long that takes.
    one = LogWriter(flush_seconds=0.05, queue_bytes=1000)
    one.start()
    try:
        one.open(attempt.pk, Stream.STDOUT)
        assert one.has_room(lambda: None)
        woken = threading.Event()
        wakes: list[int] = []

        def wake() -> None:
            wakes.append(1)
            woken.set()

        with log_writes_locked():
            one.add(attempt.pk, Stream.STDOUT, ["a" * 500, "b" * 500], (10, 2))
            assert not one.has_room(wake)
            assert not one.has_room(wake)  # asked again: woken once all the same
            one.note(attempt.pk, "taken however full")
            assert not woken.wait(0.5)
        assert woken.wait(30)
        assert one.has_room(lambda: None)
        assert one.barrier()
        assert wakes == [1]
    finally:
        one.stop()
    assert stored(attempt, Stream.STDOUT) == [(0, "a" * 500), (1, "b" * 500)]
    assert not one.has_room(lambda: None)  # stopped: what would be read could not be stored
