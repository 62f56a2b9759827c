"""/metrics for Prometheus: admins (browser session or API token) and a
scraper holding METRICS_TOKEN. Everyone else gets the API's 401 or 403."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from jobs import metrics as portal_metrics
from jobs.api.auth import Access, authenticate
from jobs.api.errors import ApiError


def _scraper(request: HttpRequest) -> bool:
    """The request carries METRICS_TOKEN (compared in constant time)."""
    expected = settings.METRICS_TOKEN
    scheme, _, value = request.META.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
    value = value.strip()
    # compare_digest refuses a str holding anything but ASCII, which no token holds.
    return bool(expected) and scheme.lower() == "bearer" and value.isascii() and hmac.compare_digest(value, expected)


@login_not_required  # a scraper has no session: checked here instead
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    if not _scraper(request):
        try:
            authenticate(request, Access.ADMIN)
        except ApiError as exc:
            return exc.response()
    response = HttpResponse(portal_metrics.render(), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
