"""Who is calling the API.

Scripts send `Authorization: Bearer <token>`. The web UI's own pages may call
the API with the browser session instead; then unsafe methods need Django's
CSRF token (the X-CSRFToken header), exactly as a form post would. A bearer
token is never combined with the session: if one is sent, it alone decides.
"""

from __future__ import annotations

from enum import Enum

from django.conf import settings
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware

from jobs.api.errors import forbidden, unauthorized
from jobs.services import tokens


class Access(Enum):
    PUBLIC = "public"  # no credentials needed (API info, its description, getting a token)
    READ = "read"  # signed in, or anyone when API_ANONYMOUS_READ is on (job list and status only)
    USER = "user"  # signed in
    ADMIN = "admin"  # signed in as an admin


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request: HttpRequest, reason: str) -> str:  # type: ignore[override]
        return reason


def _enforce_csrf(request: HttpRequest) -> None:
    check = _CsrfCheck(lambda req: None)  # type: ignore[arg-type]
    check.process_request(request)
    reason = check.process_view(request, lambda req: None, (), {})
    if reason:
        raise forbidden(f"CSRF check failed ({reason}): with the browser session, send the X-CSRFToken header; "
                        "scripts should use a bearer token instead.")


def _bearer(request: HttpRequest) -> str | None:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise unauthorized("The Authorization header must be 'Bearer <token>'.")
    return value.strip()


def bearer_key(request: HttpRequest) -> str | None:
    """The bearer token this request was authenticated with, if any."""
    return _bearer(request)


def authenticate(request: HttpRequest, access: Access) -> None:
    """Set request.user from the bearer token or the session, or raise
    UnauthorizedUserError / ForbiddenUserError for what `access` needs."""
    if access is Access.PUBLIC:
        return
    key = _bearer(request)
    if key is not None:
        try:
            request.user = tokens.token_authenticate(key)
        except tokens.TokenRejected as exc:
            raise unauthorized(f"Unauthorized: {exc}.") from None
    elif request.user.is_authenticated:
        if request.method not in ("GET", "HEAD", "OPTIONS", "TRACE"):
            _enforce_csrf(request)
    elif access is Access.READ and settings.API_ANONYMOUS_READ:
        return
    else:
        raise unauthorized()
    if access is Access.ADMIN and not request.user.is_admin:
        raise forbidden("Non-admin is not allowed to do this operation.")
