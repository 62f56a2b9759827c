"""From review of task logs end to end: what the node makes of a stream's
entries (no engine: entries are handed to the LineAssembler as Docker sends
them), and what the pages and API answer.
"""

from __future__ import annotations

import json

from jobs.models import LogLine, Stream, TaskAttempt
from jobs.node.logwriter import LineAssembler
from tests.test_many_attempts_api import _api, _job

ENTRY = 16 * 1024  # Docker splits a longer line into entries of this many bytes


def _feed_all(assembler: LineAssembler, payloads: list[bytes], *, first_ts: int = 1) -> list[str]:
    lines: list[str] = []
    for i, payload in enumerate(payloads):
        lines.extend(assembler.feed(first_ts + i, payload))
    return lines


def test_a_line_without_a_newline_is_stored_as_it_grows_not_held_whole():
    # `yes | tr -d '\n'`, or a progress bar drawn with \r for hours: the
    # node agent must not keep all of it in memory until a newline comes.
    assembler = LineAssembler(max_line_chars=65536)
    payloads = [bytes([65 + i % 26]) * ENTRY for i in range(200)]
    early = _feed_all(assembler, payloads)
    held_back = 200 * ENTRY - sum(map(len, early))
    assert 0 <= held_back <= 65536 + ENTRY
    assert all(len(line) <= 65536 for line in early)
    rest = assembler.finish()
    assert "".join(early + rest) == b"".join(payloads).decode()


def test_a_character_split_where_a_long_line_is_stored_early_is_kept_whole():
    text = "é" * (3 * ENTRY)  # two bytes each: Docker's entries end mid-character
    data = text.encode() + b"\n"
    payloads = [data[i:i + ENTRY] for i in range(0, len(data), ENTRY)]
    assembler = LineAssembler(max_line_chars=4096)
    lines = _feed_all(assembler, payloads)
    assert "".join(lines) == text and "\ufffd" not in "".join(lines)


def test_an_agent_that_restarts_mid_line_stores_the_rest_once():
    payloads = [b"x" * ENTRY for _ in range(20)] + [b"end\n", b"next\n"]
    first = LineAssembler(max_line_chars=65536)
    stored = _feed_all(first, payloads[:10])  # then the agent dies
    assert stored
    again = LineAssembler(last_ts_ns=first.cursor[0], count_at_ts=first.cursor[1], max_line_chars=65536)
    rest = [line for i, payload in enumerate(payloads, start=1) if not again.already_stored(i)
            for line in again.feed(i, payload)]
    assert "".join(stored + rest[:-1]) == "x" * (20 * ENTRY) + "end" and rest[-1] == "next"


def _json(response) -> object:
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return json.loads(body)


def test_each_job_attempts_container_log_reads_that_attempts_log(alice):
    # A retried job: v2 lists every attempt's tasks, each with its
    # containerLog; attempt 1's must not lead to attempt 2's lines.
    job = _job(alice, "retried_logs", tasks=1, retries=1, placed=2)
    for attempt in TaskAttempt.objects.filter(job=job):
        LogLine.objects.create(attempt=attempt, stream=Stream.STDOUT, seq=0, text=f"printed by attempt {attempt.number}")
    client = _api(alice)
    listed = _json(client.get(f"/api/v2/jobs/{alice.username}~{job.name}/job-attempts"))
    shown = _json(client.get(f"/api/v2/jobs/{alice.username}~{job.name}"))["jobAttempts"]
    assert {body["attemptIndex"] for body in listed} == {body["attemptIndex"] for body in shown} == {1, 2}
    for body in [*listed, *shown]:
        url = body["taskRoles"]["main"]["taskStatuses"][0]["containerLog"]
        log = _json(client.get(url.removeprefix("http://testserver")))
        assert log["attempt"] == body["attemptIndex"]
        assert log["lines"] == [f"printed by attempt {body['attemptIndex']}"]


def test_a_log_page_holds_at_most_a_megabyte_of_text_and_says_there_is_more(alice, bob):
    # Lines may be 64K characters (LOG_MAX_LINE_CHARS): a tail poll of 1,000
    # of them, or an API page of 5,000, was tens of MB held by a worker.
    from django.test import Client

    from jobs import logs

    job = _job(alice, "long_lines", tasks=1, retries=0, placed=1)
    attempt = TaskAttempt.objects.get(job=job)
    LogLine.objects.bulk_create(LogLine(attempt=attempt, stream=Stream.STDOUT, seq=seq, text=f"{seq:05d}" + "x" * 65531)
                                for seq in range(64))
    page = logs.read_lines(attempt.pk, Stream.STDOUT, limit=1000)
    assert len(page.lines) == logs.PAGE_CHARS // 65536 and page.more
    assert page.next_cursor == page.lines[-1][0] == len(page.lines) - 1
    client = _api(alice)
    path = f"/api/v1/user/{alice.username}/jobs/{job.name}/tasks/main/0/log"
    seen, after = [], -1
    while True:
        body = _json(client.get(path, {"after": after, "limit": 5000}))
        assert sum(map(len, body["lines"])) <= logs.PAGE_CHARS
        seen += body["lines"]
        after = body["next"]
        if not body["more"]:
            break
    assert [int(line[:5]) for line in seen] == list(range(64))  # every line once, in order
    browser = Client()
    browser.force_login(alice)
    tail = browser.get(f"/jobs/{job.pk}/logs/{attempt.pk}/stdout/", {"after": -1})
    assert tail.status_code == 200 and len(tail.content) < 2 * logs.PAGE_CHARS and b'data-more="1"' in tail.content
    assert _api(bob).get(path).status_code == 404 and Client().get(path).status_code == 401

