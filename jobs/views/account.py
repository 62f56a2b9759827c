"""The login page; the user's own page: SSH public keys, API tokens,
notifications; the API help page."""

from urllib.parse import urlsplit

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs.login_forms import RateLimitedLoginForm
from jobs.services import tokens
from jobs.views.access import ssh_keys_panel_context
from jobs.views.notifications import notifications_panel_context
from jobs.views.tokens import tokens_panel_context


class LoginView(auth_views.LoginView):
    redirect_authenticated_user = True
    authentication_form = RateLimitedLoginForm

    def get_redirect_url(self) -> str:
        # A `next` back to this page would send a signed-in user to it again:
        # Django raises for its bare path (a 500) and loops on one with a
        # query. Anyone can send such a link; the jobs list is where it ends.
        url = super().get_redirect_url()
        return "" if url and urlsplit(url).path == self.request.path else url


def profile(request: HttpRequest) -> HttpResponse:
    context = {"ssh_keys_panel": ssh_keys_panel_context(request), "api_tokens_panel": tokens_panel_context(request),
               "notifications_panel": notifications_panel_context(request)}
    return render(request, "jobs/profile.html", context)


def _days(seconds: int) -> str:
    days = seconds // 86400
    return "one day" if days == 1 else f"{days} days"


def api_help(request: HttpRequest) -> HttpResponse:
    expiration = {
        "min": tokens.API_MIN_SECONDS, "max": tokens.API_MAX_SECONDS, "default": tokens.API_DEFAULT_SECONDS,
        "max_days": _days(tokens.API_MAX_SECONDS), "default_days": _days(tokens.API_DEFAULT_SECONDS),
    }
    return render(request, "jobs/api_help.html", {"expiration": expiration})
