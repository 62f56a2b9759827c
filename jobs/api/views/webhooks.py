"""A user's webhook (`/user/{user}/webhook`): where their jobs' state changes
are POSTed (jobs/services/notifications.py). The user or an admin; the
secret is write-only."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from jobs.api.auth import Access
from jobs.api.errors import ApiError, forbidden, invalid
from jobs.api.http import handler, json_body, ok, resource, string_param
from jobs.models import User
from jobs.services import notifications


def _owner(request: HttpRequest, username: str) -> User:
    """The user named in the path, if the caller may manage their webhook."""
    me: User = request.user  # type: ignore[assignment]
    if not me.is_admin and me.username != username:
        # The same answer whether or not the user exists.
        raise forbidden(f"Non-admin may manage only their own webhook (user/{me.username}/webhook).")
    user = User.objects.filter(username=username).first()
    if user is None:
        raise ApiError("NoUserError", f"User {username} is not found.")
    return user


def _shown(user: User) -> dict:
    row = notifications.settings_for(user)
    return {"url": row.webhook_url if row and row.webhook_url else None}


@handler(Access.USER)
def _get(request: HttpRequest, username: str) -> HttpResponse:
    return ok(_shown(_owner(request, username)))


@handler(Access.USER)
def _put(request: HttpRequest, username: str) -> HttpResponse:
    user = _owner(request, username)
    params = json_body(request)
    url = string_param(params, "url", max_length=2000) or ""
    secret = string_param(params, "secret", max_length=notifications.SECRET_MAX_LENGTH) or ""
    try:
        notifications.webhook_set(user=user, url=url, secret=secret)
    except notifications.NotificationError as exc:
        raise invalid(f"{exc.field}: {exc.message}.") from None
    return ok(_shown(user))


@handler(Access.USER)
def _delete(request: HttpRequest, username: str) -> HttpResponse:
    notifications.webhook_remove(user=_owner(request, username))
    return ok({"message": "webhook removed"})


webhook = resource(GET=_get, PUT=_put, DELETE=_delete)
