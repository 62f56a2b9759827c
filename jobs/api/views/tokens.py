"""POST /api/v1/token: a username and password for a bearer token. Also at
OpenPAI's login path, authn/basic/login, under v1's and v2's prefixes (its web
portal and JS SDKs log in there)."""

from __future__ import annotations

from datetime import timedelta

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
    try:
        user = ratelimit.attempt_login(request, username=username, password=password)
    except ratelimit.LoginThrottled as exc:
        raise ApiError("TooManyRequestsError", exc.message, headers={"Retry-After": str(exc.wait)}) from None
    except ratelimit.LoginFailed:
        # One answer for an unknown user and a wrong password, so the
        # endpoint does not tell which usernames exist.
        raise ApiError("IncorrectPasswordError", "The username or password is incorrect.") from None
    try:
        made = tokens.token_create(user=user, lifetime=timedelta(seconds=seconds), label=label)
    except tokens.TooManyTokens as exc:
        raise ApiError("TooManyTokensError", f"No token was made: {exc}.") from None
    except tokens.CredentialsChanged as exc:
        raise ApiError("IncorrectPasswordError", f"No token was made: {exc}.") from None
    return ok({"token": made.key, "user": user.username, "admin": user.is_admin,
               "expiresAt": made.token.expires_at.isoformat()})


token = resource(POST=_create)
