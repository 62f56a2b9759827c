"""POST /api/v1/token: a username and password for a bearer token."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import authenticate
from django.http import HttpRequest, HttpResponse

from jobs.api.auth import Access
from jobs.api.errors import ApiError
from jobs.api.http import handler, int_param, json_body, ok, resource, string_param
from jobs.services import ratelimit, tokens


@handler(Access.PUBLIC)
def _create(request: HttpRequest) -> HttpResponse:
    params = json_body(request)
    username = string_param(params, "username", max_length=150) or ""
    password = string_param(params, "password", max_length=4096) or ""
    seconds = int_param(params, "expiration", default=tokens.API_DEFAULT_SECONDS,
                        minimum=tokens.API_MIN_SECONDS, maximum=tokens.API_MAX_SECONDS)
    label = string_param(params, "label", required=False, max_length=100) or "POST /api/v1/token"
    address = ratelimit.client_address(request)
    wait = ratelimit.login_wait_seconds(username=username, address=address)
    if wait:
        raise ApiError("TooManyRequestsError", f"Too many failed logins; try again in {wait} seconds.",
                       headers={"Retry-After": str(wait)})
    user = authenticate(request, username=username, password=password)
    if user is None:
        ratelimit.login_failed(username=username, address=address)
        # One answer for an unknown user and a wrong password, so the
        # endpoint does not tell which usernames exist.
        raise ApiError("IncorrectPasswordError", "The username or password is incorrect.")
    ratelimit.login_succeeded(username=username)
    made = tokens.token_create(user=user, lifetime=timedelta(seconds=seconds), label=label)
    return ok({"token": made.key, "user": user.username, "admin": user.is_admin,
               "expiresAt": made.token.expires_at.isoformat()})


token = resource(POST=_create)
