"""Users, as OpenPAI's v1 API manages them: admins create, change, remove
and list users and set their virtual clusters; a user may change their own
password."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from jobs.api import serializers
from jobs.api.auth import Access, bearer_key
from jobs.api.errors import ApiError, forbidden, invalid
from jobs.api.http import bool_param, handler, json_body, ok, resource, string_param
from jobs.models import User, VirtualCluster
from jobs.services import ratelimit, users


def _user_named(username: str) -> User:
    """The user an admin names (OpenPAI: 404 NoUserError when there is none)."""
    user = User.objects.filter(username=username).first()
    if user is None:
        raise ApiError("NoUserError", f"User {username} is not found.", status=404)
    return user


def _everyone(serialize: Callable[[User, list[str]], dict[str, Any]]) -> HttpResponse:
    everyone = list(User.objects.order_by("username").prefetch_related("virtual_clusters"))
    usable = VirtualCluster.objects.names_usable_by_each(everyone)
    return ok([serialize(user, usable[user.pk]) for user in everyone])


@handler(Access.ADMIN)
def _list(request: HttpRequest) -> HttpResponse:
    return _everyone(serializers.user)


@handler(Access.ADMIN)
def _list_v2(request: HttpRequest) -> HttpResponse:
    return _everyone(serializers.user_v2)


@handler(Access.USER)
def _put(request: HttpRequest) -> HttpResponse:
    """OpenPAI's PUT /user: `modify: false` creates a user, `modify: true`
    changes one (admins: anyone's password and admin flag; users: their own
    password only). Changing one's own password needs `oldPassword`."""
    params = json_body(request)
    username = string_param(params, "username", max_length=64) or ""
    password = string_param(params, "password", required=False, max_length=4096)
    current_password = string_param(params, "oldPassword", required=False, max_length=4096)
    admin = bool_param(params, "admin")
    modify = bool_param(params, "modify") or False
    me: User = request.user  # type: ignore[assignment]
    if not me.is_admin and not (modify and username == me.username and admin in (None, me.is_admin)):
        raise forbidden("Non-admin is not allowed to do this operation (you may change only your own password).")
    if modify:
        target = _user_named(username)
        if target.pk == me.pk and admin is False:
            raise forbidden("You cannot take away your own admin rights.")
        if admin is not None:
            users.check_admin_change(user=target, admin=admin)  # refused: the password stays as it was
        if password is not None:
            _change_password(request, user=target, password=password, current_password=current_password)
        if admin is not None:
            users.user_update(user=target, admin=admin)
    else:
        if password is None:
            raise invalid("password is required to create a user.")
        users.user_create(username=username, password=password, admin=bool(admin))
    return ok({"message": "update successfully"}, status=201)


def _change_password(request: HttpRequest, *, user: User, password: str, current_password: str | None) -> None:
    """oldPassword is tried under the failed-login limit, as a login is: a
    stolen token must not be a way to guess it without end."""
    address = ratelimit.client_address(request)
    if current_password is not None and user.pk == request.user.pk:  # an admin's reset of another's asks none
        wait = ratelimit.login_wait_seconds(username=user.username, address=address)
        if wait:
            raise ApiError("TooManyRequestsError", ratelimit.LoginThrottled(wait).message,
                           headers={"Retry-After": str(wait)})
    try:
        users.user_change_password(user=user, password=password, by=request.user, current_password=current_password,
                                   keep_token_key=bearer_key(request))
    except users.CurrentPasswordWrong:
        ratelimit.login_failed(username=user.username, address=address)
        raise


@handler(Access.ADMIN)
def _delete(request: HttpRequest) -> HttpResponse:
    params = json_body(request)
    username = string_param(params, "username", required=False, max_length=64) or request.GET.get("username")
    if not username:
        raise invalid("username is required (in the JSON body, or as ?username=).")
    users.user_delete(user=_user_named(username), by=request.user)
    return ok({"message": "remove successfully"})


@handler(Access.ADMIN)
def _set_virtual_clusters(request: HttpRequest, username: str) -> HttpResponse:
    value = json_body(request).get("virtualClusters")
    if isinstance(value, str):
        names = value.split(",")
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        names = value
    else:
        raise invalid('virtualClusters is required: names separated by commas ("vc1,vc2") or a list of names.')
    users.user_set_virtual_clusters(user=_user_named(username), names=names)
    return ok({"message": "update user virtual clusters successfully"}, status=201)


def _visible_user(request: HttpRequest, username: str) -> tuple[User, list[str]]:
    """One user and where they may submit: yourself, or anyone for an admin."""
    me: User = request.user  # type: ignore[assignment]
    if not me.is_admin and me.username != username:
        raise forbidden("Non-admin may see only their own user (user/{}).".format(me.username))
    user = _user_named(username)
    return user, [vc.name for vc in VirtualCluster.objects.usable_by(user).order_by("name")]


@handler(Access.USER)
def _detail(request: HttpRequest, username: str) -> HttpResponse:
    user, usable = _visible_user(request, username)
    return ok({**serializers.user(user, usable), "virtualClusters": usable})


@handler(Access.USER)
def _detail_v2(request: HttpRequest, username: str) -> HttpResponse:
    return ok(serializers.user_v2(*_visible_user(request, username)))


user = resource(GET=_list, PUT=_put, DELETE=_delete)
user_detail = resource(GET=_detail)
user_virtual_clusters = resource(PUT=_set_virtual_clusters)
# v2's reads of users, as OpenPAI's JS SDK makes them (GET only: users are
# changed through v1's /user).
users_v2 = resource(GET=_list_v2)
user_detail_v2 = resource(GET=_detail_v2)
