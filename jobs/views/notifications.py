"""Notifications on the profile page: the user's webhook, the job states
they want e-mail for, and their latest deliveries. Each user sees and
changes only their own: nothing here takes a user from the URL."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.models import NOTIFY_STATES, NotificationDelivery, State
from jobs.services import notifications

Status = NotificationDelivery.Status
# The badge (static/jobs/portal.css) a delivery's status shows with.
_BADGE = {Status.PENDING: "warn", Status.SENDING: "warn", Status.RETRYING: "warn", Status.DELIVERED: "ok",
          Status.FAILED: "bad", Status.REFUSED: "bad"}


# A refused webhook URL, shown once more in its box to be mended.
WEBHOOK_DRAFT = "webhook_url_draft"


def _back() -> HttpResponse:
    return redirect(reverse("jobs:profile") + "#notifications")


@require_POST
def webhook_save(request: HttpRequest) -> HttpResponse:
    url = request.POST.get("url", "")
    secret = request.POST.get("secret", "") or None  # empty: keep the secret set before
    try:
        notifications.webhook_set(user=request.user, url=url, secret=secret)
    except notifications.NotificationError as exc:
        request.session[WEBHOOK_DRAFT] = url[:2000]
        messages.error(request, f"The webhook was not saved: {exc.field}: {exc.message}.")
    else:
        messages.success(request, "Saved the webhook: your jobs' state changes are posted to it.")
    return _back()


@require_POST
def webhook_delete(request: HttpRequest) -> HttpResponse:
    if notifications.webhook_remove(user=request.user):
        messages.success(request, "Removed the webhook.")
    return _back()


@require_POST
def email_save(request: HttpRequest) -> HttpResponse:
    states = [state for state in request.POST.getlist("states") if state in NOTIFY_STATES]
    notifications.email_states_set(user=request.user, states=states)
    chosen = ", ".join(State(state).label for state in states) or "no state"
    messages.success(request, f"Saved: you get an e-mail when a job of yours is {chosen}.")
    return _back()


def notifications_panel_context(request: HttpRequest) -> dict:
    """What templates/jobs/partials/profile_notifications.html shows."""
    row = notifications.settings_for(request.user)
    email_states = set(row.email_states) if row else set()
    saved = row.webhook_url if row else ""
    draft = request.session.pop(WEBHOOK_DRAFT, None)
    return {
        "webhook_url": saved,
        "webhook_url_typed": saved if draft is None else draft,
        "secret_min": notifications.SECRET_MIN_LENGTH,
        "email_configured": notifications.email_configured(),
        "email_address": request.user.email,
        "states": [(state, State(state).label, state in email_states) for state in NOTIFY_STATES],
        "deliveries": [(delivery, _BADGE[delivery.status])
                       for delivery in notifications.deliveries_recent(request.user)],
        "allowed_networks": ", ".join(settings.WEBHOOK_ALLOWED_NETWORKS),
    }
