from collections.abc import Callable
from functools import wraps

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import include, path, re_path
from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns

from jobs.api.http import no_api_view
from jobs.api.views import root as api_root
from jobs.views.account import LoginView


def portal_admins_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """django-rq lets any is_staff user see and change its queues, which hold
    every user's job names and the nodes' launch and stop requests. Here
    staff alone is no portal right (SECURITY.md, finding 13)."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_admin:  # anonymous users never get here: LoginRequiredMiddleware
            raise PermissionDenied("The task queues are for administrators.")
        return view(request, *args, **kwargs)

    return wrapped


# django-rq's own views (its stats.json and metrics take RQ_API_TOKEN, which
# the portal does not set: /metrics is the portal's Prometheus endpoint).
_rq_urls = [*get_api_urlpatterns(), *get_admin_urlpatterns()]
for _pattern in _rq_urls:
    _pattern.callback = portal_admins_only(_pattern.callback)

urlpatterns = [
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/rq/", include((_rq_urls, "django_rq"))),
    path("admin/", admin.site.urls),
    # OpenPAI's Python SDK uses the second prefix; both serve the same API,
    # with or without the trailing slash, and JSON 404s for unknown paths.
    path("api/v1/", include(("jobs.api.urls", "api"), namespace="api")),
    path("rest-server/api/v1/", include(("jobs.api.urls", "api"), namespace="rest-server-api")),
    path("api/v2/", include(("jobs.api.urls_v2", "api_v2"), namespace="api-v2")),
    path("rest-server/api/v2/", include(("jobs.api.urls_v2", "api_v2"), namespace="rest-server-api-v2")),
    re_path(r"^(?:rest-server/)?api/v1$", api_root.info),
    re_path(r"^(?:rest-server/)?api(?:/.*)?$", no_api_view),
    path("", include("jobs.urls")),
]
