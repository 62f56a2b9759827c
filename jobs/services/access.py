"""How users reach a running task: web ports, Jupyter (with its token), SSH
commands and keys, the browser terminal, and whether a Jupyter task has gone
idle. Besides the reads, the users' own SSH public keys are written here."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote, unquote, urlencode

from django.conf import settings
from django.db import transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.urls import reverse
from django.utils import timezone

from jobs import keys
from jobs.services import webports
from jobs.environment import SSH_PORT_LABEL
from jobs.models import Job, LogLine, SshKey, Stream, TaskAttempt, TaskState, TerminalSession, User, lock_user_row

# Jupyter prints its URL with `?token=<48 hex digits>` (notebook, lab, server).
_TOKEN_RE = re.compile(r"[?&]token=([0-9a-fA-F]{16,128})\b")
_TOKEN_ARG_RE = re.compile(r"--(NotebookApp|ServerApp|IdentityProvider)\.token(?:=(.*))?", re.DOTALL)
JUPYTER_LABEL = "jupyter"
MAX_SSH_KEYS_PER_USER = 50


@dataclass(frozen=True)
class PortLink:
    label: str
    ports: list[int]
    address: str  # IP:PORT of the first port
    url: str  # the portal's way into a web label's first port (the proxy), else ""


def web_port_url(attempt: TaskAttempt, port: int, next_path: str = "") -> str:
    """The portal's link into a task's web port: it signs the user in to the
    port's own host name (jobs/services/webports.py) and lands on `next_path`,
    which the link carries signed as the portal's own choice (a path in an
    unsigned link is shown to the user before it is opened)."""
    url = reverse("jobs:web_port", args=[attempt.job_id, attempt.pk, port])
    if not next_path:
        return url
    signature = webports.landing_signature(attempt_id=attempt.pk, port=port, path=next_path)
    return url + f"?{urlencode({'next': next_path, 'landing': signature})}"


def port_links(attempt: TaskAttempt) -> list[PortLink]:
    """Each labelled port of a task as IP:PORT; web labels
    (settings.WEB_PORT_LABELS) link through the portal's proxy, as they are
    published on the node's loopback only."""
    web = set(settings.WEB_PORT_LABELS)
    links = []
    for label, ports in sorted(attempt.ports.items()):
        if not ports:
            continue
        address = f"{attempt.host_ip}:{ports[0]}"
        links.append(PortLink(label, list(ports), address, web_port_url(attempt, ports[0]) if label in web else ""))
    return links


def token_in_command(command: str) -> str | None:
    """The token a command gives Jupyter (`--NotebookApp.token=...`, or
    ServerApp / IdentityProvider), as the shell would pass it; None if it
    sets none. Jupyter prints such a token as "..." in its log, so this is
    the only place to find it (the reference's Jupyter example sets one)."""
    try:
        words = shlex.split(command, comments=False, posix=True)
    except ValueError:  # unbalanced quotes: not a command we can read
        return None
    for number, word in enumerate(words):
        match = _TOKEN_ARG_RE.fullmatch(word)
        if match is None:
            continue
        if match.group(2) is not None:
            return match.group(2)
        return words[number + 1] if number + 1 < len(words) else None
    return None


def known_token(token: str | None) -> str | None:
    """`token` unless what the command gives is filled in later, by the
    shell ($VAR) or by the portal (a v2 secret or parameter, <% ... %>):
    the page cannot know it then."""
    if token is None or "$" in token or "<%" in token:
        return None
    return token


def role_command(job: Job, role_name: str) -> str:
    """A task role's command as the user wrote it (the spec keeps commands
    verbatim: no variable is substituted in them)."""
    return job.spec.role(role_name).command


def jupyter_token(job: Job, attempt: TaskAttempt) -> str:
    """The token to open the task's Jupyter with: the one its command sets,
    else the one the server printed in the log (the latest: a restarted
    server prints a new one); "" if neither."""
    return jupyter_tokens(job, [attempt])[attempt.pk]


# Lines holding "token=" read per task, newest first, for the one Jupyter printed.
TOKEN_LINES = 50


def jupyter_tokens(job: Job, attempts: list[TaskAttempt]) -> dict[int, str]:
    """`jupyter_token` of each of the job's attempts, by id, from one query
    of their logs at most (the job page polls every task's)."""
    tokens: dict[int, str] = {}
    from_log = []
    for attempt in attempts:
        from_command = token_in_command(role_command(job, attempt.task.role))
        # Jupyter prints a token it was given as "...": the log cannot tell it either.
        tokens[attempt.pk] = "" if from_command is None else known_token(from_command) or ""
        if from_command is None:
            from_log.append(attempt.pk)
    if not from_log:
        return tokens
    newest = Window(RowNumber(), partition_by=F("attempt_id"), order_by=[F("stream").desc(), F("seq").desc()])
    lines = (LogLine.objects.filter(attempt_id__in=from_log, stream__in=(Stream.STDERR, Stream.STDOUT),
                                    text__contains="token=")
             .annotate(newest=newest).filter(newest__lte=TOKEN_LINES))
    for attempt_id, text in lines.order_by("attempt_id", "-stream", "-seq").values_list("attempt_id", "text"):
        match = None if tokens[attempt_id] else _TOKEN_RE.search(text)
        if match:
            tokens[attempt_id] = match.group(1)
    return tokens


def jupyter_url(job: Job, attempt: TaskAttempt, *, token: str | None = None) -> str:
    """One click into the task's Jupyter through the portal's proxy, with
    its token if known (`token`: the one `jupyter_token` gives, if read already)."""
    ports = attempt.ports.get(JUPYTER_LABEL) or []
    if not ports or attempt.state != TaskState.RUNNING:
        return ""
    token = jupyter_token(job, attempt) if token is None else token
    return web_port_url(attempt, ports[0], f"/?token={quote(token, safe='')}" if token else "")


@dataclass(frozen=True)
class SshAccess:
    available: bool | None  # None: not known yet (the task is starting)
    host: str
    port: int | None
    command: str
    note: str


NO_SSH_SERVER = ("This image has no SSH server (/usr/sbin/sshd), so SSH is not available; "
                 "install openssh-server in the image to use it. The terminal in the browser works without it.")


def ssh_access(attempt: TaskAttempt, *, key_file: str = "<key file>") -> SshAccess:
    ports = attempt.ports.get(SSH_PORT_LABEL) or []
    port = ports[0] if ports else None
    command = f"ssh -p {port} root@{attempt.host_ip} -i {key_file}" if port else ""
    if attempt.ssh_available is False:
        return SshAccess(False, attempt.host_ip, port, "", NO_SSH_SERVER)
    if attempt.state != TaskState.RUNNING:
        return SshAccess(attempt.ssh_available, attempt.host_ip, port, command, "SSH works while the task runs.")
    return SshAccess(attempt.ssh_available, attempt.host_ip, port, command, "")


def ssh_key_file_name(job: Job) -> str:
    """The name the job's private key downloads as (and the ssh command uses)."""
    return f"{job.name}.key"


def ensure_job_key_pair(job: Job) -> None:
    """Give `job` its SSH key pair if it has none yet, and set it on `job`.

    A job gets its pair when its first task launches, not when it is
    submitted: only a job that runs needs one (its tasks' authorized key and
    their peer key), so a job stopped while it waits never held a private
    key, and submitting a job costs no key generation (bench/api_submit_rate.py).
    The tasks of one job may launch at once on several nodes: the first
    conditional UPDATE wins, and the others read the pair it stored."""
    if job.ssh_public_key:
        return
    private_key, public_key = keys.new_key_pair(f"pai-job-{job.owner.username}-{job.name}")
    sealed = keys.seal_private_key(private_key)
    if Job.objects.filter(pk=job.pk, ssh_public_key="").update(ssh_private_key=sealed, ssh_public_key=public_key):
        job.ssh_private_key, job.ssh_public_key = sealed, public_key
    else:
        job.refresh_from_db(fields=["ssh_private_key", "ssh_public_key"])


def job_private_key(*, job: Job, user: User) -> str | None:
    """The job's SSH private key for its owner; None for anyone else, admins
    included (they may see and stop any job, not log in as its owner). The
    web page and the REST API both serve the key through this one rule."""
    if job.owner_id != user.pk or not job.ssh_private_key:
        return None
    return keys.open_private_key(job.ssh_private_key)


def terminal_ready(attempt: TaskAttempt) -> bool:
    """May a terminal be opened into this task (by someone allowed to)?"""
    return attempt.state == TaskState.RUNNING and bool(attempt.container_id)


def last_activity(attempt: TaskAttempt, *, terminal_open: bool | None = None) -> datetime | None:
    """When the task last showed a sign of use: log output (jobs/logs.py),
    or a terminal session opened or closed in it (services/terminals.py); both
    move last_activity_at forward. A terminal still open is use right now
    (`terminal_open`: whether one is, if read already)."""
    moments = [attempt.last_activity_at, attempt.started_at]
    if terminal_open is None:
        terminal_open = attempt.terminal_sessions.filter(ended_at__isnull=True).exists()
    if terminal_open:
        moments.append(timezone.now())
    known = [m for m in moments if m is not None]
    return max(known) if known else None


def _watched_for_idleness(attempt: TaskAttempt) -> bool:
    return attempt.state == TaskState.RUNNING and JUPYTER_LABEL in attempt.ports


def idle_minutes(attempt: TaskAttempt, *, terminal_open: bool | None = None) -> int | None:
    """Minutes without activity of a running task with a Jupyter port, once
    past settings.JUPYTER_IDLE_MINUTES; None otherwise."""
    if not _watched_for_idleness(attempt):
        return None
    last = last_activity(attempt, terminal_open=terminal_open)
    if last is None:
        return None
    idle = timezone.now() - last
    if idle < timedelta(minutes=settings.JUPYTER_IDLE_MINUTES):
        return None
    return int(idle.total_seconds() // 60)


@dataclass(frozen=True)
class TaskAccess:
    """Everything the job page offers to reach one task attempt."""

    is_owner: bool
    ssh: SshAccess
    key_file: str
    can_open_terminal: bool
    jupyter_url: str
    jupyter_has_token: bool
    idle_minutes: int | None


def task_access(*, job: Job, attempt: TaskAttempt, user: User, jupyter_token: str | None = None,
                terminal_open: bool | None = None) -> TaskAccess:
    """`jupyter_token` and `terminal_open`: what `tasks_access` read of
    all the job's tasks at once (read here when not given)."""
    is_owner = job.owner_id == user.pk
    key_file = ssh_key_file_name(job)
    url = jupyter_url(job, attempt, token=jupyter_token)
    return TaskAccess(
        is_owner=is_owner, ssh=ssh_access(attempt, key_file=key_file), key_file=key_file,
        can_open_terminal=terminal_ready(attempt) and (is_owner or user.is_admin),
        jupyter_url=url, jupyter_has_token="?token=" in unquote(url),
        idle_minutes=idle_minutes(attempt, terminal_open=terminal_open),
    )


def tasks_access(*, job: Job, attempts: list[TaskAttempt], user: User) -> dict[int, TaskAccess]:
    """task_access of each active attempt, by attempt id: what the job page's
    task tables offer (an attempt that has ended offers nothing). The logs
    and terminals of a job of 1,000 Jupyter tasks are read in two queries,
    not two per task: the page polls them every few seconds."""
    active = [a for a in attempts if a.is_active]
    tokens = jupyter_tokens(job, [a for a in active if a.state == TaskState.RUNNING and a.ports.get(JUPYTER_LABEL)])
    watched = [a.pk for a in active if _watched_for_idleness(a)]
    open_terminals = set(TerminalSession.objects.filter(attempt_id__in=watched, ended_at__isnull=True)
                         .values_list("attempt_id", flat=True)) if watched else set()
    return {a.pk: task_access(job=job, attempt=a, user=user, jupyter_token=tokens.get(a.pk),
                              terminal_open=a.pk in open_terminals) for a in active}


# ------------------------------------------------------- users' public keys

class SshKeyError(ValueError):
    """A public key that cannot be stored; `field` names the form field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def ssh_key_add(*, user: User, title: str, public_key: str) -> SshKey:
    """Store one of the user's public keys; it is authorized in the
    containers of the jobs they start from now on."""
    try:
        line, fingerprint = keys.check_public_key(public_key)
    except keys.BadPublicKey as exc:
        raise SshKeyError("public_key", str(exc)) from None
    title = title.strip() or (line.split(" ", 2)[2] if line.count(" ") >= 2 else fingerprint)
    if len(title) > 100:
        raise SshKeyError("title", "expected at most 100 characters")
    with transaction.atomic():
        # The user's row, locked, makes the checks and the insert one step for
        # that user's concurrent requests: neither the same key twice nor a
        # key past the limit (PostgreSQL; SQLite takes one writer at a time).
        lock_user_row(user.pk)
        existing = SshKey.objects.filter(user=user, fingerprint=fingerprint).first()
        if existing is not None:
            raise SshKeyError("public_key", f'you already added this key, as "{existing.title}"')
        if SshKey.objects.filter(user=user).count() >= MAX_SSH_KEYS_PER_USER:
            raise SshKeyError("public_key", f"you have {MAX_SSH_KEYS_PER_USER} keys already; delete one first")
        return SshKey.objects.create(user=user, title=title, public_key=line, fingerprint=fingerprint)


def ssh_key_delete(*, user: User, key_id: int) -> bool:
    """Delete one of the user's keys; False if it is not theirs (or gone)."""
    deleted, _ = SshKey.objects.filter(pk=key_id, user=user).delete()
    return deleted > 0
