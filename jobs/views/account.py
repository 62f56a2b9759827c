"""The user's own page: SSH public keys, API tokens; the API help page; the
login form."""

from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs.services import ratelimit, tokens


def profile(request: HttpRequest) -> HttpResponse:
    return render(request, "jobs/profile.html", {})


def _days(seconds: int) -> str:
    days = seconds // 86400
    return "one day" if days == 1 else f"{days} days"


def api_help(request: HttpRequest) -> HttpResponse:
    expiration = {
        "min": tokens.API_MIN_SECONDS, "max": tokens.API_MAX_SECONDS, "default": tokens.API_DEFAULT_SECONDS,
        "max_days": _days(tokens.API_MAX_SECONDS), "default_days": _days(tokens.API_DEFAULT_SECONDS),
    }
    return render(request, "jobs/api_help.html", {"expiration": expiration})


class RateLimitedLoginForm(AuthenticationForm):
    """The login form with the API's failed-login limit (jobs/services/ratelimit.py)."""

    rate_limit_message = ""  # shown by registration/login.html instead of the usual error

    def clean(self):
        try:
            ratelimit.attempt_login(self.request, username=self.data.get("username", ""), check=self._check_password)
        except ratelimit.LoginThrottled as exc:
            self.rate_limit_message = exc.message
            raise ValidationError(exc.message, code="rate_limited") from None
        return self.cleaned_data

    def _check_password(self):
        """AuthenticationForm's own check: the user, None when a field was
        missing (nothing was tried), ValidationError when it failed."""
        super().clean()
        return self.get_user()
