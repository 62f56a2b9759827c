from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.urls import include, path, re_path

from jobs.api.http import no_api_view
from jobs.api.views import root as api_root
from jobs.services import ratelimit


class RateLimitedLoginForm(AuthenticationForm):
    """The login form with the API's failed-login limit (jobs/services/ratelimit.py)."""

    def clean(self):
        username, address = self.data.get("username", ""), ratelimit.client_address(self.request)
        wait = ratelimit.login_wait_seconds(username=username, address=address)
        if wait:
            self.rate_limit_message = f"Too many failed logins; try again in {wait} seconds."
            raise ValidationError(self.rate_limit_message, code="rate_limited")
        try:
            cleaned = super().clean()
        except ValidationError:
            ratelimit.login_failed(username=username, address=address)
            raise
        if self.get_user() is not None:  # None when a field was missing: nothing was tried
            ratelimit.login_succeeded(username=username)
        return cleaned


urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True, authentication_form=RateLimitedLoginForm),
         name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/rq/", include("django_rq.urls")),
    path("admin/", admin.site.urls),
    # OpenPAI's Python SDK uses the second prefix; both serve the same API,
    # with or without the trailing slash, and JSON 404s for unknown paths.
    path("api/v1/", include(("jobs.api.urls", "api"), namespace="api")),
    path("rest-server/api/v1/", include(("jobs.api.urls", "api"), namespace="rest-server-api")),
    re_path(r"^(?:rest-server/)?api/v1$", api_root.info),
    re_path(r"^(?:rest-server/)?api(?:/.*)?$", no_api_view),
    path("", include("jobs.urls")),
]
