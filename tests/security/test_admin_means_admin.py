"""Finding 13: `is_staff` alone granted full portal admin. Portal admin is
now an explicit right: a superuser, or the `jobs.administer_portal`
permission (given to the user or to one of their groups)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import Group, Permission
from django.test import Client

from jobs.models import Job, User
from jobs.services import tokens
from tests.helpers import config, role, submit


def _permission() -> Permission:
    return Permission.objects.get(codename="administer_portal", content_type__app_label="jobs")


def _api(user: User | None, path: str) -> int:
    headers = {}
    if user is not None:
        key = tokens.token_create(user=user, lifetime=timedelta(hours=1)).key
        headers["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return Client().get(path, **headers).status_code


def _page(user: User, path: str) -> int:
    client = Client()
    client.force_login(user)
    return client.get(path).status_code


def test_it_gives_staff_alone_no_portal_rights(make_user, alice):
    staff = make_user("staff")
    User.objects.filter(pk=staff.pk).update(is_staff=True, is_superuser=False)
    staff = User.objects.get(pk=staff.pk)
    job = submit(alice, config("private", role(command="sleep 1")))
    assert not staff.is_admin
    assert _page(staff, f"/jobs/{job.pk}/") == 404
    assert _api(staff, "/api/v1/user") == 403
    assert _api(None, "/api/v1/user") == 401


def test_it_makes_admins_of_the_permission_and_of_superusers(make_user, alice, admin_user):
    job = submit(alice, config("seen", role(command="sleep 1")))
    granted = make_user("granted")
    granted.user_permissions.add(_permission())
    granted = User.objects.get(pk=granted.pk)  # a fresh permission cache
    by_group = make_user("grouped")
    group, _ = Group.objects.get_or_create(name="portal-admins")
    group.permissions.add(_permission())
    by_group.groups.add(group)
    by_group = User.objects.get(pk=by_group.pk)
    for user in (granted, by_group, admin_user):
        assert user.is_admin, user
        assert _page(user, f"/jobs/{job.pk}/") == 200
        assert _api(user, "/api/v1/user") == 200
    assert Job.objects.visible_to(granted).filter(pk=job.pk).exists()


def test_it_takes_the_right_away_at_once_from_remembered_tokens(make_user):
    user = make_user("revoked")
    user.user_permissions.add(_permission())
    key = tokens.token_create(user=User.objects.get(pk=user.pk), lifetime=timedelta(hours=1)).key
    client = Client()
    assert client.get("/api/v1/user", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    user.user_permissions.remove(_permission())
    assert client.get("/api/v1/user", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 403
