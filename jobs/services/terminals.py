"""Browser terminal sessions: who may open a shell in a task, and the audit
record of each one (TerminalSession, which admins see). The WebSocket
consumer (jobs/terminal.py) bridges the shell and calls these for the rest.

A session opened or closed is use of the task: it moves the attempt's
last_activity_at, which the idle notice reads (access.last_activity).

An open shell lasts only as long as the right to open it: the consumer asks
`terminal_session_check` every few seconds, and the shell closes once the
browser session behind it is gone (signed out, password changed, expired),
the user is deactivated, or they are no longer the job's owner or an admin.
A user has at most TERMINAL_SESSIONS_PER_USER shells open at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from importlib import import_module

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from jobs.models import Job, TaskAttempt, TaskState, TerminalSession, User, lock_user_row
from jobs.services import access


class TerminalRefused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TerminalForbidden(TerminalRefused):
    """No such task, or the user may not open a shell in it."""


class TerminalNotRunning(TerminalRefused):
    """The task is not running (yet, or any more)."""


class TerminalTooMany(TerminalRefused):
    """The user has TERMINAL_SESSIONS_PER_USER shells open already."""


@dataclass(frozen=True)
class TerminalTarget:
    """Where the opened session's shell is to run."""

    session_id: int
    docker_host: str
    container_id: str


def terminal_session_open(*, user: User | AnonymousUser, attempt_id: int, client_address: str) -> TerminalTarget:
    """Check the user may open a shell in this task (the job's owner or an
    admin, while it runs); record the session."""
    attempt = None
    if user.is_authenticated:  # visible_to: the job's owner, or an admin
        attempt = TaskAttempt.objects.select_related("node").filter(
            pk=attempt_id, job__in=Job.objects.visible_to(user)).first()
    if attempt is None:
        raise TerminalForbidden("no such task, or it is not yours")
    if not access.terminal_ready(attempt) or attempt.node is None:
        raise TerminalNotRunning("the task is not running")
    now = timezone.now()
    with transaction.atomic():
        # One user's opens one at a time (a row lock on PostgreSQL; SQLite's
        # IMMEDIATE transactions are serial anyway): two at once cannot both
        # pass the count.
        lock_user_row(user.pk)
        _check_open_sessions(user)
        session = TerminalSession.objects.create(user=user, attempt=attempt, client_address=client_address[:64],
                                                 started_at=now)
        _note_activity(attempt.pk, now)
    return TerminalTarget(session.pk, attempt.node.docker_host, attempt.container_id)


def _check_open_sessions(user: User) -> None:
    # Sessions of tasks that ended do not count: a worker that died with a
    # shell open never recorded its end.
    limit = settings.TERMINAL_SESSIONS_PER_USER
    open_now = TerminalSession.objects.filter(user=user, ended_at__isnull=True,
                                              attempt__state=TaskState.RUNNING).count()
    if open_now >= limit:
        raise TerminalTooMany(f"you have {open_now} terminals open, the most one user may have at once "
                              f"(TERMINAL_SESSIONS_PER_USER={limit}); close one first")


SIGNED_OUT = "you signed out, or your session ended"


def terminal_session_check(*, user_id: int, session_key: str | None, attempt_id: int) -> str | None:
    """None while the user may keep this shell open, else why it closes."""
    user = User.objects.filter(pk=user_id).first()
    if user is None or not user.is_active:
        return "your account was deactivated"
    if not _still_signed_in(user, session_key):
        return SIGNED_OUT
    if not Job.objects.visible_to(user).filter(task_attempts__pk=attempt_id).exists():
        return "you may no longer open a shell in this task"
    return None


def _still_signed_in(user: User, session_key: str | None) -> bool:
    """Is the browser session the shell was opened from still this user's?
    Django's own test (django.contrib.auth.get_user), without its side
    effects: a password change alters the hash a session holds, and signing
    out deletes the session."""
    if not session_key:
        return False
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key).load()
    if str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    stored = data.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(stored, known) for known in hashes)


def terminal_session_close(*, session_id: int, attempt_id: int, reason: str) -> bool:
    """Record the end of a session; False if it was closed already."""
    now = timezone.now()
    with transaction.atomic():
        closed = TerminalSession.objects.filter(pk=session_id, ended_at__isnull=True).update(
            ended_at=now, end_reason=reason[:200]
        )
        if closed:
            _note_activity(attempt_id, now)
    return closed == 1


def _note_activity(attempt_id: int, now: datetime) -> None:
    """Only ever move last_activity_at forward: log batches move it too."""
    TaskAttempt.objects.filter(Q(last_activity_at__isnull=True) | Q(last_activity_at__lt=now), pk=attempt_id).update(
        last_activity_at=now
    )
