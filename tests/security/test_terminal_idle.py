"""Finding 41: a browser terminal had no idle timeout. A shell left open in
a forgotten tab (root in the task's container) stayed open for as long as
the portal session lasted, for whoever came to that screen, held one of
the user's TERMINAL_SESSIONS_PER_USER, and kept a quiet Jupyter task
counted as in use (an open terminal is use: no idle notice, ever).

Now a terminal the browser sends no input to for TERMINAL_IDLE_SECONDS is
closed, saying so (close code 4408; the page offers a new session)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from jobs.models import TerminalSession
from tests.cluster import wait_for
from tests.helpers import config, login, role, running_attempt, submit
from tests.test_access import refusal, refusal_after_output, terminal_socket

pytestmark = pytest.mark.services
IDLE_SECONDS = 4


@pytest.fixture(scope="module")
def impatient_portal(cluster) -> Iterator[str]:
    """A portal on the cluster closing terminals idle for IDLE_SECONDS."""
    shared = cluster.base_url
    cluster.start_portal(name="gunicorn-idle", env={"TERMINAL_IDLE_SECONDS": str(IDLE_SECONDS)})
    impatient, cluster.base_url = cluster.base_url, shared
    yield impatient
    cluster.processes.pop("gunicorn-idle").stop()


def _typed(shell, text: str, expect: bytes) -> None:
    shell.send(json.dumps({"type": "input", "data": text}))
    seen = b""
    while expect not in seen:
        seen += shell.recv(timeout=10)


def test_it_closes_a_terminal_nobody_types_in(alice, bob, impatient_portal):
    base = impatient_portal
    job = submit(alice, config("idle_shell", role(command="sleep 600")))
    attempt = running_attempt(job)
    with terminal_socket(base, attempt.pk, login(base, alice)) as shell:
        # Typing keeps it open past the idle time; resizes (the page sends
        # them by itself) do not count.
        started = time.monotonic()
        while time.monotonic() - started < IDLE_SECONDS * 2:
            _typed(shell, "echo typed-$((6*7))\r", b"typed-42")
            time.sleep(1)
        idle_from = time.monotonic()
        shell.send(json.dumps({"type": "resize", "rows": 30, "cols": 90}))
        message, code = refusal_after_output(shell)
        assert time.monotonic() - idle_from < IDLE_SECONDS + 6
        assert (message, code) == (f"no input for {IDLE_SECONDS} s: the terminal is closed", 4408)
    session = wait_for(lambda: TerminalSession.objects.filter(attempt=attempt, ended_at__isnull=False).first(),
                       what="the session's end to be recorded")
    assert session.end_reason == f"no input for {IDLE_SECONDS} s: the terminal is closed"
    # Still the owner's only.
    with terminal_socket(base, attempt.pk, login(base, bob)) as stranger:
        assert refusal(stranger) == ("no such task, or it is not yours", 4403)
    with terminal_socket(base, attempt.pk, None) as anonymous:
        assert refusal(anonymous)[1] == 4403
