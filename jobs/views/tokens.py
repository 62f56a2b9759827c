"""API tokens on the profile page: create one (shown once), revoke one."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.models import ApiToken
from jobs.services import tokens

# The new token travels to the profile page once, through the session, and
# is removed from it when shown (tokens_panel_context).
NEW_TOKEN = "api_token_new"
LIFETIME_CHOICES = [(1, "1 day"), (7, "7 days"), (30, "30 days"), (90, "90 days"), (tokens.PAGE_MAX_DAYS, "1 year")]


class TokenForm(forms.Form):
    label = forms.CharField(max_length=100, required=False, help_text="What the token is for, e.g. 'laptop scripts'.")
    days = forms.TypedChoiceField(choices=LIFETIME_CHOICES, coerce=int, initial=30, label="Expires after")


def _back() -> HttpResponse:
    return redirect(reverse("jobs:profile") + "#api-tokens")


@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST)
    if not form.is_valid():
        messages.error(request, "The token was not created: " + "; ".join(
            f"{field}: {' '.join(errors)}" for field, errors in form.errors.items()))
        return _back()
    label = form.cleaned_data["label"].strip() or "web"
    try:
        made = tokens.token_create(user=request.user, lifetime=timedelta(days=form.cleaned_data["days"]), label=label)
    except (tokens.TooManyTokens, tokens.CredentialsChanged) as exc:
        messages.error(request, f"The token was not created: {exc}.")
        return _back()
    request.session[NEW_TOKEN] = {"id": made.token.pk, "key": made.key}
    messages.success(request, f'Created the token "{label}". Copy it now: it is shown only once.')
    return _back()


@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    if tokens.token_revoke(token=token):
        messages.success(request, f'Revoked the token "{token.label}" ({token.prefix}…); it no longer works.')
    return _back()


def tokens_panel_context(request: HttpRequest) -> dict:
    """What templates/jobs/partials/profile_tokens.html shows, for the
    profile view; takes a new token out of the session (it is shown once)."""
    new = request.session.pop(NEW_TOKEN, None)
    return {"tokens": list(request.user.api_tokens.all()[:200]), "new_token": new, "form": TokenForm()}
