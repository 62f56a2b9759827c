"""Finding 11: the browser terminal wrote binary input without waiting for
the shell to take it, so a client could grow a worker's memory without
bound, and an open shell outlived signing out, a password change,
deactivation and the loss of admin rights. Now every write waits (drain)
and uvicorn bounds one message, the session and the user's rights are
checked again every few seconds, and a user has at most
TERMINAL_SESSIONS_PER_USER shells open. Real WebSocket clients against the
test cluster's gunicorn."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from websockets.protocol import State
from websockets.sync.client import connect as ws_connect

from jobs.models import TerminalSession, User
from jobs.terminal import SHELL_LOST, SHELL_STALLED
from tests.cluster import wait_for
from tests.helpers import config, csrf_token, hashed_password, login, role, running_attempt, submit
from tests.test_access import container_processes, refusal, refusal_after_output, terminal_socket

pytestmark = pytest.mark.services
MB = 1024 * 1024
FLOOD_BYTES = 256 * MB


@contextmanager
def _ready_shell(base: str, attempt_id: int, browser: requests.Session, *, compressed: bool = True) -> Iterator:
    opened = terminal_socket(base, attempt_id, browser) if compressed else _uncompressed_socket(base, attempt_id, browser)
    with opened as shell:
        shell.send(json.dumps({"type": "input", "data": "echo ready-$((6*7))\r"}))
        seen = b""
        while b"ready-42" not in seen:
            seen += shell.recv(timeout=10)
        yield shell


def _uncompressed_socket(base: str, attempt_id: int, browser: requests.Session):
    """A terminal WebSocket without permessage-deflate: what the client
    sends is then what crosses the wire, byte for byte."""
    cookies = "; ".join(f"{c.name}={c.value}" for c in browser.cookies)
    return ws_connect(base.replace("http://", "ws://") + f"/ws/terminal/{attempt_id}/", origin=base,
                      additional_headers={"Cookie": cookies}, proxy=None, open_timeout=10, compression=None)


def _closed_within(shell, seconds: float) -> tuple[str, int]:
    started = time.monotonic()
    closed = refusal_after_output(shell)
    assert time.monotonic() - started < seconds
    return closed


@pytest.fixture
def task(alice, cluster):
    job = submit(alice, config("shell", role(command="sleep 600")))
    return job, running_attempt(job)


def test_it_closes_an_open_shell_when_its_user_signs_out(alice, task, cluster):
    base, (_job, attempt) = cluster.base_url, task
    browser, other_browser = login(base, alice), login(base, alice)
    with _ready_shell(base, attempt.pk, browser) as shell, _ready_shell(base, attempt.pk, other_browser) as other:
        page = browser.get(f"{base}/")
        assert browser.post(f"{base}/logout/", data={"csrfmiddlewaretoken": csrf_token(page.text)},
                            headers={"Referer": f"{base}/"}).ok
        assert _closed_within(shell, 10) == ("you signed out, or your session ended", 4401)
        other.send(json.dumps({"type": "input", "data": "echo still-$((40+2))\r"}))  # that browser stays in
        seen = b""
        while b"still-42" not in seen:
            seen += other.recv(timeout=10)
    wait_for(lambda: TerminalSession.objects.filter(attempt=attempt, end_reason="you signed out, or your session ended")
             .exists(), what="the session to be recorded as ended by signing out")


def test_it_keeps_a_shell_open_after_input_it_cannot_read_and_closes_it_as_usual(alice, task, cluster):
    # A lone surrogate (as JSON.stringify sends one) and JSON nested deeper
    # than Python's json reads once ended the consumer with an exception,
    # which skipped its disconnect: the session stayed open, counting
    # against TERMINAL_SESSIONS_PER_USER, and the shell was never hung up.
    base, (_job, attempt) = cluster.base_url, task
    with _ready_shell(base, attempt.pk, login(base, alice)) as shell:
        shell.send('{"type": "input", "data": "\\ud800"}')
        shell.send("[" * 100_000)
        # The surrogate reached the shell as "?": a line of its own first.
        shell.send(json.dumps({"type": "input", "data": "\recho after-$((6*7))\r"}))
        seen = b""
        while b"after-42" not in seen:
            seen += shell.recv(timeout=10)
    wait_for(lambda: TerminalSession.objects.filter(attempt=attempt, ended_at__isnull=False).exists(),
             what="the session's end to be recorded")
    wait_for(lambda: "sh -l" not in container_processes(attempt), timeout=10, what="the shell to be hung up")


def test_it_closes_an_open_shell_when_the_password_changes(alice, task, cluster):
    base, (_job, attempt) = cluster.base_url, task
    with _ready_shell(base, attempt.pk, login(base, alice)) as shell:
        User.objects.filter(pk=alice.pk).update(password=hashed_password("a-New-long-pass-phrase-9"))
        assert _closed_within(shell, 10) == ("you signed out, or your session ended", 4401)


def test_it_closes_an_open_shell_when_the_user_is_deactivated(alice, task, cluster):
    base, (_job, attempt) = cluster.base_url, task
    with _ready_shell(base, attempt.pk, login(base, alice)) as shell:
        User.objects.filter(pk=alice.pk).update(is_active=False)
        assert _closed_within(shell, 10) == ("your account was deactivated", 4403)
    # The shell itself was hung up, not left running in the container.
    wait_for(lambda: "sh -l" not in container_processes(attempt), timeout=10, what="the shell to end")


def test_it_closes_an_admins_shell_in_another_users_task_when_the_admin_right_goes(task, cluster, admin_user):
    base, (_job, attempt) = cluster.base_url, task
    with _ready_shell(base, attempt.pk, login(base, admin_user)) as shell:
        User.objects.filter(pk=admin_user.pk).update(is_superuser=False)
        assert _closed_within(shell, 10) == ("you may no longer open a shell in this task", 4403)


def test_it_refuses_one_terminal_more_than_a_user_may_have_and_strangers(alice, bob, task, cluster):
    base, (_job, attempt) = cluster.base_url, task
    browser = login(base, alice)
    with ExitStack() as shells:
        first = shells.enter_context(_ready_shell(base, attempt.pk, browser))
        for _ in range(3):  # four: TERMINAL_SESSIONS_PER_USER's default
            shells.enter_context(_ready_shell(base, attempt.pk, browser))
        with terminal_socket(base, attempt.pk, browser) as fifth:
            assert refusal(fifth) == ("you have 4 terminals open, the most one user may have at once "
                                      "(TERMINAL_SESSIONS_PER_USER=4); close one first", 4429)
        with terminal_socket(base, attempt.pk, login(base, bob)) as stranger:
            assert refusal(stranger) == ("no such task, or it is not yours", 4403)
        with terminal_socket(base, attempt.pk, None) as anonymous:
            assert refusal(anonymous)[1] == 4403
        first.close()
        wait_for(lambda: TerminalSession.objects.filter(user=alice, ended_at__isnull=True).count() == 3,
                 what="the closed session to be recorded")
        shells.enter_context(_ready_shell(base, attempt.pk, browser))  # room again


def _worker_pids(cluster) -> list[int]:
    master = cluster.processes["gunicorn"].popen.pid
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            pids.append(int(stat.parent.name))
    return pids


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def test_it_bounds_what_a_client_flooding_a_shell_makes_a_worker_hold(alice, task, cluster):
    """The finding itself: input no longer piles up in the worker. Each write
    waits for the engine, and the consumer reads nothing meanwhile. This
    client compresses (permessage-deflate, as browsers do): a 64 KB frame of
    repeated lines is about a hundred bytes on the wire, so the kernel's
    socket buffers alone take the whole flood while the portal reads
    nothing; after TERMINAL_INPUT_STALL_SECONDS the session ends in words,
    and what follows is dropped unread. Either way the worker's memory stays
    bounded and it keeps serving."""
    base, (_job, attempt) = cluster.base_url, task
    workers = _worker_pids(cluster)
    rss_before = _rss(workers)
    with _ready_shell(base, attempt.pk, login(base, alice)) as shell:
        outcome = _flood(shell, attempt)
        assert requests.get(f"{cluster.base_url}/login/", timeout=10).status_code == 200  # the worker still serves
        assert _rss(workers) - rss_before < 100 * MB
        if not outcome.paused:  # ended in words, not dropped silently
            assert outcome.close_reason in (SHELL_LOST, SHELL_STALLED.format(seconds=5)), outcome
        outcome.stop()
    wait_for(lambda: "sleep 601" not in container_processes(attempt), timeout=20, what="the flooded shell to end")
    with _ready_shell(base, attempt.pk, login(base, alice)):
        pass


@pytest.fixture
def patient_portal(cluster) -> Iterator[str]:
    """A second portal on the cluster whose terminals wait for a shell that
    reads nothing far longer than a test looks (the cluster's own closes
    them after TERMINAL_INPUT_STALL_SECONDS=5): a pause is then seen while
    the session is open, never raced against its end."""
    shared = cluster.base_url
    cluster.start_portal(name="gunicorn-patient", env={"TERMINAL_INPUT_STALL_SECONDS": "600"})
    patient, cluster.base_url = cluster.base_url, shared
    yield patient
    cluster.processes.pop("gunicorn-patient").stop()


def _kernel_buffers_at_most() -> int:
    """What the kernel may hold of a connection whose reader has stopped:
    the client's send buffer and the portal's receive buffer, each at the
    largest autotuning lets it grow (tcp_wmem and tcp_rmem, third values)."""
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    return wmem + rmem


def test_it_pauses_a_client_that_floods_a_shell_that_reads_nothing(alice, task, patient_portal):
    """The consumer stops reading while a write to the shell waits, so the
    client is held by TCP. What it gets to send first is bounded by buffers:
    the kernel's on both ends of its connection, uvicorn's one read (256 KB)
    and one message (512 KB), the write buffer to the engine (64 KB), and
    what the engine's exec stream takes before it blocks (its socket
    buffers, a pipe and the terminal's: about 360 KB, measured)."""
    base, (_job, attempt) = patient_portal, task
    with _ready_shell(base, attempt.pk, login(base, alice), compressed=False) as shell:
        outcome = _flood(shell, attempt)
        assert outcome.paused, "the portal took the flood from a client while the shell read nothing"
        assert outcome.sent < _kernel_buffers_at_most() + 2 * MB, outcome
        outcome.stop()


@dataclass
class _Flood:
    paused: bool
    sent: int
    close_reason: str
    stop: Callable[[], None]


def _flood(shell, attempt) -> _Flood:
    # A foreground command that reads nothing: input piles up in the
    # terminal (a few KB), then in the engine, then (before the fix) in the portal.
    shell.send(json.dumps({"type": "input", "data": "stty -echo; sleep 601\r"}))
    wait_for(lambda: "sleep 601" in container_processes(attempt), what="the shell's command to run")
    sent, finished, failed = [0], threading.Event(), []

    def flood() -> None:
        # Whole lines: a terminal drops what passes its buffer within one line.
        frame = (b"x" * 1023 + b"\n") * 64
        try:
            for _ in range(FLOOD_BYTES // len(frame)):
                shell.send(frame)
                sent[0] += len(frame)
            finished.set()
        except Exception as exc:  # the socket shut below
            failed.append(exc)

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()

    def stalled() -> bool:
        before = sent[0]
        time.sleep(1.0)  # a sample of progress, not a wait for the server
        return finished.is_set() or bool(failed) or shell.protocol.state is not State.OPEN or (
            before > 0 and sent[0] == before)

    wait_for(stalled, timeout=60, interval=0, what="the flood to stall, end or be refused")
    paused = not finished.is_set() and not failed and shell.protocol.state is State.OPEN
    close_reason = "" if paused else _close_reason(shell)

    def stop() -> None:
        try:
            shell.socket.shutdown(socket.SHUT_RDWR)  # unblocks the sender
        except OSError:
            pass
        sender.join(timeout=30)

    return _Flood(paused=paused, sent=sent[0], close_reason=close_reason, stop=stop)


def _close_reason(shell) -> str:
    """The error message the portal sent before it closed the session."""
    try:
        while True:
            message = shell.recv(timeout=10)
            if isinstance(message, str) and json.loads(message).get("type") == "error":
                return json.loads(message)["message"]
    except Exception:  # closed: nothing more to read
        return f"closed {shell.close_code} {shell.close_reason!r}"
