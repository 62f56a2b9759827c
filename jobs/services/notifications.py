"""Telling users when their jobs change state: a webhook and e-mail.

Three parts, in the order an event meets them:

- `job_state_changed` is called by the lifecycle (lifecycle.py, and
  scheduling.py for WAITING -> RUNNING) inside the transaction that made
  the change, right after its conditional UPDATE. It only looks whether the
  owner (or the job's `extras.jobStatusChangeNotification`) asks for
  anything and, if so, enqueues the event after commit: a slow or dead
  receiver never holds up a state change, and a rolled-back change tells
  no one.
- `job_state_record` runs in a node agent's worker (jobs/tasks.py, the
  notify queue): it records one delivery row per channel, before the
  worker hands each to the agent's notification threads for its first
  try, so one still waiting there when the agent stops is found by the
  repair sweep.
- `delivery_try` makes one try; a failure worth repeating is tried again
  after the next wait of WEBHOOK_RETRY_SECONDS (queues.schedule_delivery_retry,
  moved back onto the queue by the agents' heartbeats).

Webhook deliveries are signed with the user's secret, their id and the
time of the try with the body (jobs/webhooks.py, which also keeps
deliveries inside WEBHOOK_ALLOWED_NETWORKS). The Profile page and
`/api/v1/user/{user}/webhook` change the settings through the functions at
the top.
"""

from __future__ import annotations

import json
import logging
import smtplib
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from jobs import formatting, keys, queues, webhooks
from jobs.completion import Trigger
from jobs.models import NOTIFY_STATES, Job, NotificationDelivery, NotificationSettings, TaskAttempt, User

log = logging.getLogger(__name__)

EVENT = "jobStateChanged"
SECRET_MIN_LENGTH = 16
SECRET_MAX_LENGTH = 256
# Delivery rows kept per user (the page shows the latest RECENT).
KEEP_PER_USER = 200
RECENT = 20
Status = NotificationDelivery.Status
Channel = NotificationDelivery.Channel


class NotificationError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# ------------------------------------------------------------------ settings


def email_configured() -> bool:
    return bool(settings.EMAIL_HOST)


def settings_for(user: User) -> NotificationSettings | None:
    return NotificationSettings.objects.filter(user=user).first()


def webhook_url_problem(url: str) -> str | None:
    """Why `url` cannot be a webhook, or None. Host names are checked at
    each delivery, on the addresses they resolve to then."""
    try:
        target = webhooks.parse_url(url)
    except ValueError as exc:
        return str(exc)
    address = webhooks.literal_address(target.host)
    if address is not None and not webhooks.address_allowed(address, settings.WEBHOOK_ALLOWED_NETWORKS):
        return f"{address} is outside the networks webhooks may reach (WEBHOOK_ALLOWED_NETWORKS)"
    return None


def webhook_set(*, user: User, url: str, secret: str | None) -> NotificationSettings:
    """Set the user's webhook. `secret` None keeps the one set before (the
    Profile page leaves the field empty to keep it)."""
    url = url.strip()
    problem = webhook_url_problem(url)
    if problem:
        raise NotificationError("url", problem)
    row, _created = NotificationSettings.objects.get_or_create(user=user)
    if secret is None and not row.webhook_secret_sealed:
        raise NotificationError("secret", "a secret is required: deliveries are signed with it")
    if secret is not None and not SECRET_MIN_LENGTH <= len(secret) <= SECRET_MAX_LENGTH:
        raise NotificationError("secret", f"the secret must be {SECRET_MIN_LENGTH} to {SECRET_MAX_LENGTH} characters")
    sealed = keys.seal_private_key(secret) if secret is not None else row.webhook_secret_sealed
    NotificationSettings.objects.filter(pk=row.pk).update(webhook_url=url, webhook_secret_sealed=sealed,
                                                          updated_at=timezone.now())
    row.refresh_from_db()
    return row


def webhook_remove(*, user: User) -> bool:
    """False if there was none. Retries still waiting are given up."""
    return NotificationSettings.objects.filter(user=user).exclude(webhook_url="").update(
        webhook_url="", webhook_secret_sealed="", updated_at=timezone.now()) == 1


def email_states_set(*, user: User, states: Collection[str]) -> NotificationSettings:
    unknown = set(states) - set(NOTIFY_STATES)
    if unknown:
        raise NotificationError("states", f"unknown job states: {', '.join(sorted(unknown))}")
    row, _created = NotificationSettings.objects.get_or_create(user=user)
    chosen = [state for state in NOTIFY_STATES if state in states]
    NotificationSettings.objects.filter(pk=row.pk).update(email_states=chosen, updated_at=timezone.now())
    row.refresh_from_db()
    return row


def deliveries_recent(user: User, limit: int = RECENT) -> list[NotificationDelivery]:
    return list(NotificationDelivery.objects.filter(user=user).order_by("-id")[:limit])


# ------------------------------------------------------------ the lifecycle's hook


def job_asks(job: Job, state: str) -> bool:
    """OpenPAI's `extras.jobStatusChangeNotification` ({"running": true,
    "failed": true, ...}; `true` for every state) asks for e-mail."""
    value = job.spec.extras.get("jobStatusChangeNotification")
    if value is True:
        return True
    return isinstance(value, dict) and value.get(state.lower()) is True


def job_state_changed(*, job: Job, previous: str, state: str, reason: str = "", at: datetime | None = None,
                      trigger: Trigger | None = None) -> None:
    """The job went from `previous` to `state` in the current transaction:
    tell its owner after commit, if they (or the job) asked to be told.
    `trigger`: what ended it, for a final state."""
    if state not in NOTIFY_STATES:
        return
    row = NotificationSettings.objects.filter(user_id=job.owner_id).values_list("webhook_url", "email_states").first()
    _tell_after_commit(job, row, previous=previous, state=state, reason=reason, at=at, trigger=trigger)


def jobs_state_changed(*, jobs: list[Job], previous: str, state: str) -> None:
    """`job_state_changed` for many jobs at once, with one query for their
    owners' settings: a scheduling pass may start thousands."""
    if state not in NOTIFY_STATES or not jobs:
        return
    rows = {user_id: (webhook_url, email_states) for user_id, webhook_url, email_states in
            NotificationSettings.objects.filter(user_id__in={job.owner_id for job in jobs})
            .values_list("user_id", "webhook_url", "email_states")}
    for job in jobs:
        _tell_after_commit(job, rows.get(job.owner_id), previous=previous, state=state)


def _tell_after_commit(job: Job, row: tuple[str, list] | None, *, previous: str, state: str, reason: str = "",
                       at: datetime | None = None, trigger: Trigger | None = None) -> None:
    """Enqueue the event after commit if the owner's settings (`row`:
    webhook URL and e-mail states, or None) or the job ask for it."""
    webhook = bool(row and row[0])
    email = email_configured() and (bool(row and state in row[1]) or job_asks(job, state))
    if not (webhook or email):
        return
    event = {"job_id": job.pk, "owner_id": job.owner_id, "job_name": job.name, "state": state, "previous": previous,
             "reason": reason, "time": formatting.utc_millis(at or timezone.now())}
    if trigger is not None:
        event.update(trigger_message=trigger.message, trigger_role=trigger.role, trigger_index=trigger.index)
    transaction.on_commit(lambda: _enqueue(event))


def _enqueue(event: dict[str, Any]) -> None:
    try:
        queues.enqueue_notification(event)
    except Exception:  # Redis away: the state change stands; this notice is lost
        log.exception("could not enqueue the notification of job %s %s", event["job_id"], event["state"])


# ------------------------------------------------------------------ the worker


def _payload(event: dict[str, Any], username: str) -> dict[str, Any]:
    """The webhook's body (and what the e-mail is written from). The
    appExitTrigger* fields are the job status's (jobs/api/serializers.py):
    null for RUNNING, for a stop's task, and for an event queued before
    they were sent."""
    path = reverse("jobs:detail", args=[event["job_id"]])
    return {
        "event": EVENT, "job": f"{username}~{event['job_name']}", "jobName": event["job_name"], "user": username,
        "state": event["state"], "previousState": event["previous"], "exitReason": event["reason"] or None,
        "appExitTriggerMessage": event.get("trigger_message") or None,
        "appExitTriggerTaskRoleName": event.get("trigger_role") or None,
        "appExitTriggerTaskIndex": event.get("trigger_index"),  # 0 is a task's index, not "none"
        "time": event["time"], "url": f"{settings.PORTAL_URL}{path}",
    }


def job_state_record(event: dict[str, Any]) -> list[int]:
    """Record a delivery (PENDING) per channel the owner wants for this
    event; returns their ids, oldest first, for `delivery_try`."""
    owner = User.objects.filter(pk=event["owner_id"]).first()
    if owner is None:
        return []
    row = settings_for(owner)
    job = Job.objects.filter(pk=event["job_id"]).first()
    payload = _payload(event, owner.username)
    made: list[NotificationDelivery] = []
    if row and row.webhook_url:
        made.append(NotificationDelivery(user=owner, job=job, channel=Channel.WEBHOOK, payload=payload,
                                         target=row.webhook_url))
    wanted = bool(row and event["state"] in row.email_states) or (job is not None and job_asks(job, event["state"]))
    if email_configured() and wanted:
        made.append(NotificationDelivery(user=owner, job=job, channel=Channel.EMAIL, payload=payload,
                                         target=owner.email))
    if not made:
        return []
    ids = [delivery.pk for delivery in NotificationDelivery.objects.bulk_create(made)]
    _prune(owner)
    return ids


IDLE_EVENT = "idleGpus"


def idle_gpus_notify(*, attempt: TaskAttempt, since: datetime, stop_at: datetime | None = None) -> list[int]:
    """Tell a task's owner its GPUs sit idle (IDLE_GPU_POLICY=notify or
    stop), once: by webhook (event "idleGpus") and by e-mail if the portal
    has SMTP and they have an address. `stop_at` (policy stop): when the job
    will be stopped if they stay idle ("stopAt", null otherwise). Called by
    jobs/services/usage.py."""
    owner = attempt.job.owner
    row = settings_for(owner)
    payload = {"event": IDLE_EVENT, "job": f"{owner.username}~{attempt.job.name}", "jobName": attempt.job.name,
               "user": owner.username, "task": f"{attempt.task.role}-{attempt.task.index}", "gpus": attempt.gpus,
               "idleSince": formatting.utc_millis(since), "thresholdPercent": settings.IDLE_GPU_PERCENT,
               "stopAt": formatting.utc_millis(stop_at) if stop_at else None, "time": formatting.utc_millis(timezone.now()),
               "url": f"{settings.PORTAL_URL}{reverse('jobs:detail', args=[attempt.job_id])}"}
    made = []
    if row and row.webhook_url:
        made.append(NotificationDelivery(user=owner, job=attempt.job, channel=Channel.WEBHOOK, payload=payload,
                                         target=row.webhook_url))
    if email_configured() and owner.email:
        made.append(NotificationDelivery(user=owner, job=attempt.job, channel=Channel.EMAIL, payload=payload,
                                         target=owner.email))
    ids = [delivery.pk for delivery in NotificationDelivery.objects.bulk_create(made)]
    for delivery_id in ids:
        transaction.on_commit(lambda delivery_id=delivery_id: queues.enqueue_delivery(delivery_id), robust=True)
    return ids


def _prune(owner: User) -> None:
    """Keep a user's newest KEEP_PER_USER deliveries (and any still going)."""
    cutoff = list(NotificationDelivery.objects.filter(user=owner).order_by("-id")
                  .values_list("id", flat=True)[KEEP_PER_USER:KEEP_PER_USER + 1])
    if cutoff:
        NotificationDelivery.objects.filter(user=owner, id__lte=cutoff[0]).exclude(
            status__in=(Status.PENDING, Status.SENDING, Status.RETRYING)).delete()


def delivery_owner(delivery_id: int) -> int | None:
    """The user a delivery is for (None if it is gone)."""
    return NotificationDelivery.objects.filter(pk=delivery_id).values_list("user_id", flat=True).first()


def delivery_try(delivery_id: int) -> str | None:
    """Try a delivery once and record how it went; returns its new status
    (None if it was not waiting for a try: done, or taken by another worker)."""
    held = _hold_behind_failure(delivery_id)
    if held is not _NOT_HELD:
        return held
    claimed = _waiting(delivery_id).update(status=Status.SENDING, tries=F("tries") + 1, last_try_at=timezone.now(), next_try_at=None)
    if not claimed:
        return None
    delivery = NotificationDelivery.objects.get(pk=delivery_id)
    if delivery.channel == Channel.WEBHOOK:
        target, outcome = _send_webhook(delivery)
    else:
        # The account's address as it is now, as a retried webhook uses the webhook as it is now.
        target = User.objects.filter(pk=delivery.user_id).values_list("email", flat=True).first() or ""
        outcome = _send_email(delivery, target)
    return _record(delivery, target, outcome)


# How much sooner than its next_try_at a retry may be taken: the agent that
# moves it onto the queue may run a little ahead of the one trying it.
EARLY_SECONDS = 5.0


def _waiting(delivery_id: int) -> QuerySet[NotificationDelivery]:
    """The delivery if it waits for a try that is due now. A retry can be on
    the queue more than once (the retry set's entry and the repair sweep's,
    one per sweep while the queue is behind): the first entry tries it, the
    others find it waiting for its next try and leave it, so no wait is
    skipped."""
    due = Q(next_try_at__isnull=True) | Q(next_try_at__lte=timezone.now() + timedelta(seconds=EARLY_SECONDS))
    return NotificationDelivery.objects.filter(due, pk=delivery_id, status__in=(Status.PENDING, Status.RETRYING))


# ------------------------------------------------- a receiver that is down
# Each try of a receiver that never answers holds a notify thread for
# WEBHOOK_TIMEOUT_SECONDS. While one of a user's deliveries waits to be
# tried again because their receiver failed, the user's other deliveries to
# the same URL wait with it, untried, and are tried after it: a receiver
# that is down costs one try per wait of WEBHOOK_RETRY_SECONDS, however many
# events its user's jobs make, and the threads stay free for other users.
#
# The held ones come due a try's length after the failed one, so that its
# try (on whichever node's thread) comes first; and while that try is under
# way they wait for it too. A held delivery keeps its tries; it is tried for
# real once no failed delivery is waiting before it (the receiver answered,
# or the failed one gave up). One that has waited as long as its own tries
# would have lasted is given up untried: with a receiver that stays down,
# each held delivery would otherwise wait behind every one before it, a
# whole retry schedule each, and waiting (RETRYING) rows are never pruned
# (_prune), so a user's rows grew with every event.

_NOT_HELD = "not held"
HOLD_MARGIN_SECONDS = 1.0


def _try_length() -> timedelta:
    """How long one webhook try may take, with a margin."""
    return timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS + HOLD_MARGIN_SECONDS)


def held_delivery_budget() -> timedelta:
    """How long a delivery may wait held: its own tries' waits and lengths,
    had it been tried at once and failed each time."""
    waits = settings.WEBHOOK_RETRY_SECONDS
    return timedelta(seconds=sum(waits)) + (len(waits) + 1) * _try_length()


def _hold_behind_failure(delivery_id: int) -> str | None:
    """RETRYING if the delivery now waits behind an older failed one to the
    same receiver (FAILED if it has waited longer than held_delivery_budget()),
    None if it was not waiting for a try, else _NOT_HELD. Only older ones
    hold it: two that failed at once, each held behind the other, were
    never tried again."""
    waiting = _waiting(delivery_id)
    delivery = waiting.filter(channel=Channel.WEBHOOK).values("user_id", "created_at").first()
    url = delivery and NotificationSettings.objects.filter(user_id=delivery["user_id"]).values_list(
        "webhook_url", flat=True).first()
    if not url:
        return _NOT_HELD
    now = timezone.now()
    same_receiver = NotificationDelivery.objects.filter(
        user_id=delivery["user_id"], channel=Channel.WEBHOOK, target=url, pk__lt=delivery_id)
    try_length = _try_length()
    failed = (same_receiver.filter(status=Status.RETRYING, tries__gte=1, next_try_at__gt=now)
              .order_by("next_try_at").values("id", "next_try_at", "result").first())
    if failed is not None:
        due = failed["next_try_at"] + try_length
        why = f"this webhook did not take delivery {failed['id']} ({failed['result']})"
    else:
        # A failed one being tried again right now (a second try or later).
        retrying = (same_receiver.filter(status=Status.SENDING, tries__gte=2, last_try_at__gt=now - try_length)
                    .values("id").first())
        if retrying is None:
            return _NOT_HELD
        first_wait = settings.WEBHOOK_RETRY_SECONDS[0] if settings.WEBHOOK_RETRY_SECONDS else 0
        due = now + max(try_length, timedelta(seconds=first_wait))
        why = f"delivery {retrying['id']}, which this webhook did not take before, is being tried again"
    if now - delivery["created_at"] > held_delivery_budget():
        gave_up = waiting.update(
            status=Status.FAILED, next_try_at=None,
            result=f"gave up untried after waiting as long as its own tries would have taken: {why}"[:2000])
        return Status.FAILED if gave_up else None
    held = waiting.update(
        status=Status.RETRYING, target=url, next_try_at=due, result=f"not tried yet: {why}; tried after it"[:2000])
    if not held:
        return None
    queues.schedule_delivery_retry(delivery_id, due.timestamp())
    return Status.RETRYING


# ------------------------------------------------------------ repair sweep
# A worker that dies (its agent SIGKILLed, its machine lost) can leave a
# delivery SENDING (claimed, never recorded) or PENDING (stored, never
# tried), and a flushed Redis loses the retries waiting there (RETRYING).
# Node agents' heartbeats call `deliveries_repair` (one agent per
# REPAIR_EVERY_SECONDS, by a Redis lock), which puts such deliveries back
# on the notify queue: a stuck delivery is tried again within
# `stuck_after()` plus REPAIR_EVERY_SECONDS plus one heartbeat.

REPAIR_EVERY_SECONDS = 30
REPAIR_GRACE_SECONDS = 60  # a PENDING delivery is tried at once; a RETRYING one when due


def stuck_after() -> timedelta:
    """How long a try may take before its worker is taken for dead: a
    webhook try ends within WEBHOOK_TIMEOUT_SECONDS (jobs/webhooks.py); an
    SMTP exchange has EMAIL_TIMEOUT per step, so allow a few steps."""
    return timedelta(seconds=max(settings.WEBHOOK_TIMEOUT_SECONDS, 4 * settings.EMAIL_TIMEOUT) + REPAIR_GRACE_SECONDS)


def deliveries_repair(*, now: datetime | None = None, force: bool = False) -> list[int]:
    """Put deliveries a dead worker or a lost Redis left behind back on the
    queue; returns their ids. A try that was cut off counts as a try (its
    receiver may have got it: webhooks are at-least-once, and
    X-Portal-Delivery lets a receiver drop a repeat)."""
    lock = f"{settings.PAI_INSTANCE}:notify-repair"
    if not force and not queues.connection().set(lock, "1", nx=True, ex=REPAIR_EVERY_SECONDS):
        return []
    now = now or timezone.now()
    grace = now - timedelta(seconds=REPAIR_GRACE_SECONDS)
    stuck = list(NotificationDelivery.objects.filter(status=Status.SENDING, last_try_at__lt=now - stuck_after())
                 .values_list("id", "tries"))
    for delivery_id, tries in stuck:
        gave_up = tries > len(settings.WEBHOOK_RETRY_SECONDS)
        NotificationDelivery.objects.filter(pk=delivery_id, status=Status.SENDING).update(
            status=Status.FAILED if gave_up else Status.RETRYING, next_try_at=None if gave_up else now,
            result="the worker trying it stopped" + (f" (gave up after {tries} tries)" if gave_up else
                                                      "; it will be tried again"))
    waiting = (NotificationDelivery.objects.filter(status=Status.PENDING, created_at__lt=grace) |
               NotificationDelivery.objects.filter(status=Status.RETRYING, next_try_at__lt=grace) |
               NotificationDelivery.objects.filter(pk__in=[d for d, _ in stuck], status=Status.RETRYING))
    ids = sorted(set(waiting.values_list("id", flat=True)))
    for delivery_id in ids:
        queues.enqueue_delivery(delivery_id)  # delivery_try claims it, so a repeat is harmless
    return ids


def _send_webhook(delivery: NotificationDelivery) -> tuple[str, webhooks.Outcome]:
    # The webhook as it is now: a changed URL or secret applies to retries too.
    row = NotificationSettings.objects.filter(user_id=delivery.user_id).first()
    if row is None or not row.webhook_url:
        return delivery.target, webhooks.Outcome(False, retry=False, message="the webhook was removed")
    try:
        secret = keys.open_private_key(row.webhook_secret_sealed)
    except keys.SealedKeyUnreadable:
        return row.webhook_url, webhooks.Outcome(False, retry=False, message="the webhook's secret was sealed with "
                                                 "a secret key this portal no longer has: set the webhook again")
    body = json.dumps(delivery.payload, ensure_ascii=False, separators=(",", ":")).encode()
    headers = {"X-Portal-Event": delivery.payload["event"],
               **webhooks.signed_headers(delivery_id=str(delivery.pk), body=body, secret=secret)}
    outcome = webhooks.post(row.webhook_url, body, headers, networks=settings.WEBHOOK_ALLOWED_NETWORKS,
                            timeout=settings.WEBHOOK_TIMEOUT_SECONDS)
    return row.webhook_url, outcome


def email_subject(payload: dict[str, Any]) -> str:
    if payload["event"] == IDLE_EVENT:
        stopping = f"; it will be stopped at {payload['stopAt']}" if payload.get("stopAt") else ""
        return f"Job {payload['job']}: the GPUs of task {payload['task']} are idle{stopping}"
    return f"Job {payload['job']} is {payload['state'].lower()}"


def _email_text(payload: dict[str, Any]) -> str:
    if payload["event"] == IDLE_EVENT:
        text = (f"Task {payload['task']} of your job {payload['job']} holds GPUs {payload['gpus']}, and they have "
                f"been under {payload['thresholdPercent']:g}% busy since {payload['idleSince']}. ")
        if payload.get("stopAt"):  # deliveries stored before IDLE_GPU_POLICY=stop existed have no stopAt
            text += (f"The portal will stop the job at {payload['stopAt']} (reason: idle GPUs reclaimed) unless "
                     "they get busy again before then. Stop it yourself sooner if it no longer needs them.")
        else:
            text += "Stop the job if it no longer needs them, so others can use them."
        return f"{text}\nJob page: {payload['url']}\n"
    lines = [f"Your job {payload['job']} went from {payload['previousState']} to {payload['state']} "
             f"at {payload['time']}."]
    if payload["exitReason"]:
        lines.append(f"Reason: {payload['exitReason']}")
    ended_by = _email_trigger_line(payload)
    if ended_by:
        lines.append(ended_by)
    lines += [f"Job page: {payload['url']}", "",
              "You get this because you asked for it on your Profile page, or the job's config asks for it "
              "(extras.jobStatusChangeNotification)."]
    return "\n".join(lines)


def _email_trigger_line(payload: dict[str, Any]) -> str:
    """What ended the job, as the job page says it: "Ended by: task main-2
    (minFailedTaskCount ...)". A stop names no task: its message ("stopped
    by alice") is said once, here only if the reason has not said it.
    Deliveries stored before the trigger was sent have none."""
    message = payload.get("appExitTriggerMessage")
    task = formatting.trigger_words(message, payload.get("appExitTriggerTaskRoleName"),
                                    payload.get("appExitTriggerTaskIndex"))
    if task:
        return f"Ended by: {task}"
    unsaid = formatting.unsaid_trigger_message(message, payload.get("exitReason") or "")
    return f"Ended: {unsaid}" if unsaid else ""


def _send_email(delivery: NotificationDelivery, address: str) -> webhooks.Outcome:
    if not email_configured():
        return webhooks.Outcome(False, retry=False, message="the portal has no SMTP server (EMAIL_HOST)")
    if not address:
        return webhooks.Outcome(False, retry=False, message="your account has no e-mail address; ask an admin")
    message = EmailMessage(email_subject(delivery.payload), _email_text(delivery.payload), to=[address],
                           headers={"Auto-Submitted": "auto-generated"})
    try:
        message.send()
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _text in exc.recipients.values()]
        return webhooks.Outcome(False, retry=any(code < 500 for code in codes),
                                message=f"the SMTP server refused {address}: {codes}")
    except smtplib.SMTPResponseException as exc:
        return webhooks.Outcome(False, retry=exc.smtp_code < 500, status=exc.smtp_code,
                                message=f"SMTP {exc.smtp_code}: {exc.smtp_error!r}")
    except (smtplib.SMTPException, OSError) as exc:
        return webhooks.Outcome(False, retry=True, message=f"SMTP failed: {exc}")
    return webhooks.Outcome(True, retry=False, message="accepted by the SMTP server")


def _record(delivery: NotificationDelivery, target: str, outcome: webhooks.Outcome) -> str:
    waits = settings.WEBHOOK_RETRY_SECONDS
    message = outcome.message
    next_try = None
    if outcome.delivered:
        status = Status.DELIVERED
    elif outcome.refused:
        status = Status.REFUSED
    elif outcome.retry and delivery.tries <= len(waits):
        status = Status.RETRYING
        next_try = timezone.now() + timedelta(seconds=waits[delivery.tries - 1])
    else:
        status = Status.FAILED
        if outcome.retry:
            message += f" (gave up after {delivery.tries} tries)"
    NotificationDelivery.objects.filter(pk=delivery.pk).update(
        status=status, target=target, response_code=outcome.status, result=message[:2000], next_try_at=next_try)
    if next_try is not None:
        queues.schedule_delivery_retry(delivery.pk, next_try.timestamp())
    return status
