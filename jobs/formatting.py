"""Numbers, sizes, durations and outcomes in the words the pages use.

Pure functions of their arguments, with no template machinery, so forms,
views and the template tags (jobs/templatetags/job_pages.py registers them
as filters) all say "1.5 GB" or "3m 07s" the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from jobs.models import ExitType


def duration_text(value: timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = max(0, int(value.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


def utc_millis(at: datetime) -> str:
    """A moment as the REST API and notifications give it: UTC, to the
    millisecond, with a Z ("2026-11-30T09:43:00.760Z")."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def mb(value: float | int | None) -> str:
    """Memory in MB as people read it."""
    if value is None:
        return "—"
    if value >= 1024:
        return f"{value / 1024:.1f} GB".replace(".0 GB", " GB")
    return f"{value:.0f} MB"


def mb_share(value: float) -> str:
    """Memory like `mb`, but a share's fractional megabytes keep their
    decimal ("341.3 MB")."""
    return f"{num(round(value / 1024, 1))} GB" if value >= 1024 else f"{num(value)} MB"


def num(value: float | int | None) -> str:
    """A resource amount: whole numbers without decimals, others with one."""
    if value is None:
        return "—"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def percent_of(used: float, total: float) -> int:
    if not total:
        return 0
    return max(0, min(100, round(100 * used / total)))


def plural(count: int, word: str) -> str:
    """'1 task', '3 tasks'."""
    return f"{count} {word}{'' if count == 1 else 's'}"


class Ended(Protocol):
    """A job, job attempt or task attempt, as far as its outcome goes."""

    exit_type: str
    exit_code: int | None
    exit_reason: str


def exit_words(item: Ended) -> str:
    """An ended job, attempt or task's outcome in words: what happened, the
    exit code when it means something, and the recorded reason."""
    if not item.exit_type and not item.exit_reason:
        return ""
    words = ExitType(item.exit_type).label if item.exit_type else ""
    if item.exit_type == ExitType.SUCCEEDED:
        words = "completed successfully"
    if item.exit_code not in (None, 0) or item.exit_type == ExitType.USER_EXIT:
        words += f" (exit code {item.exit_code})"
    reason = (item.exit_reason or "").strip()
    if reason and reason.lower() not in words.lower():
        words = f"{words}: {reason}" if words else reason
    return words[:1].upper() + words[1:]


class Triggered(Protocol):
    """A job or job attempt, as far as what ended it goes."""

    exit_trigger_message: str | None
    exit_trigger_role: str | None
    exit_trigger_index: int | None


def exit_trigger_words(item: Triggered) -> str:
    """The task whose completion ended a job or attempt, and the rule it
    fired: "task worker-2 (minFailedTaskCount 1 of role worker reached: 1
    task failed)". Empty for an end no task triggered (a stop), whose exit
    words already say who ended it."""
    return trigger_words(item.exit_trigger_message, item.exit_trigger_role, item.exit_trigger_index)


def trigger_words(message: str | None, role: str | None, index: int | None) -> str:
    """`exit_trigger_words` of the three values (as a webhook payload or
    e-mail holds them)."""
    task = _trigger_task(role, index)
    if not task:
        return ""
    return f"task {task} ({message})" if message else f"task {task}"


def _trigger_task(role: str | None, index: int | None) -> str:
    """The triggering task as "main-2"; "" for an end no task triggered (a stop)."""
    return f"{role}-{index}" if role is not None and index is not None else ""


def unsaid_trigger_message(message: str | None, said: str) -> str:
    """A stop's trigger message (it names no task), unless `said` (the
    exit words or reason shown beside it) says it already."""
    return message if message and message.lower() not in said.lower() else ""


class EndedAndTriggered(Ended, Triggered, Protocol):
    """A job or job attempt: its outcome and what ended it."""


def attempt_trigger_line(item: EndedAndTriggered) -> str:
    """What ended a job attempt, in a line short enough for the attempts
    table, under its exit words: "ended by main-2: minFailedTaskCount 1 of
    role main reached: 1 task failed". A stop names no task: its message
    ("stopped by the platform: ..."), unless the exit words say it already."""
    message = item.exit_trigger_message or ""
    task = _trigger_task(item.exit_trigger_role, item.exit_trigger_index)
    if task:
        return f"ended by {task}: {message}" if message else f"ended by {task}"
    return unsaid_trigger_message(message, exit_words(item))


def short_id(container_id: str) -> str:
    """A container id as `docker ps` shows it."""
    return container_id[:12]
