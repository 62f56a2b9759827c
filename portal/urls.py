from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from jobs.api.http import no_api_view
from jobs.api.views import root as api_root
from jobs.login_forms import RateLimitedLoginForm

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
    path("api/v2/", include(("jobs.api.urls_v2", "api_v2"), namespace="api-v2")),
    path("rest-server/api/v2/", include(("jobs.api.urls_v2", "api_v2"), namespace="rest-server-api-v2")),
    re_path(r"^(?:rest-server/)?api/v1$", api_root.info),
    re_path(r"^(?:rest-server/)?api(?:/.*)?$", no_api_view),
    path("", include("jobs.urls")),
]
