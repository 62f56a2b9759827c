"""Findings 22-24: ways around the failed-login limit (a username spelled
another way the login forms read as the same; the current password asked
by a password change, guessed with a stolen token or session), and a staff
user who may change users or groups giving themselves a portal admin's
rights or taking over an admin in the Django admin."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.services import ratelimit

THROTTLED = "Too many failed logins"


def _fullwidth(name: str) -> str:
    """The same name in Unicode's fullwidth forms: NFKC makes it `name` again."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in name)


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_it_counts_a_username_the_form_normalizes_as_that_username(path, admin_user, settings):
    """The login forms NFKC-normalize the username (Django's UsernameField):
    "ａｄｍｉｎ" signs in as "admin". The limit must count such a spelling
    as the name it signs in as, or every spelling is a fresh allowance."""
    settings.LOGIN_FAILURES_ALLOWED = 1
    address = "198.51.100.71"
    ratelimit.login_reset(username=admin_user.username, address=address)
    try:
        client = Client(REMOTE_ADDR=address)
        client.post(path, {"username": admin_user.username, "password": "wrong", "next": "/"})
        response = client.post(path, {"username": _fullwidth(admin_user.username),
                                      "password": admin_user.test_password, "next": "/"})
        assert "_auth_user_id" not in client.session
        assert THROTTLED in response.content.decode()
    finally:
        ratelimit.login_reset(username=admin_user.username, address=address)


def test_it_counts_wrong_current_passwords_on_put_user_as_failed_logins(alice, settings):
    """PUT /api/v1/user asks for oldPassword so that a stolen token alone
    cannot take the account over; unthrottled, it was a way to guess that
    password without end, around the failed-login limit."""
    import json
    from datetime import timedelta

    from jobs.services import tokens

    settings.LOGIN_FAILURES_ALLOWED = 2
    address = "198.51.100.72"
    ratelimit.login_reset(username=alice.username, address=address)
    key = tokens.token_create(user=alice, lifetime=timedelta(hours=1)).key
    client = Client(REMOTE_ADDR=address, HTTP_AUTHORIZATION=f"Bearer {key}")

    def change(old: str):
        body = {"username": alice.username, "password": "a-New-long-pass-phrase-9", "modify": True,
                "oldPassword": old}
        return client.put("/api/v1/user", data=json.dumps(body), content_type="application/json")

    try:
        for guess in ("guess-1", "guess-2"):
            assert change(guess).status_code == 403
        throttled = change(alice.test_password)
        assert throttled.status_code == 429, throttled.content
        assert "Retry-After" in throttled
        alice.refresh_from_db()
        assert alice.check_password(alice.test_password)
        login = Client(REMOTE_ADDR=address).post("/api/v1/token", data=json.dumps(
            {"username": alice.username, "password": alice.test_password}), content_type="application/json")
        assert login.status_code == 429  # one limit for every way a password is tried
    finally:
        ratelimit.login_reset(username=alice.username, address=address)


def test_it_counts_wrong_old_passwords_on_the_django_admins_password_page(make_user, settings):
    """/admin/password_change/ checks the old password too: unthrottled, a
    staff user's stolen session guessed it there without end."""
    from jobs.models import User

    settings.LOGIN_FAILURES_ALLOWED = 2
    address = "198.51.100.73"
    staff = make_user("staffpw")
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    ratelimit.login_reset(username=staff.username, address=address)
    client = Client(REMOTE_ADDR=address)
    client.force_login(User.objects.get(pk=staff.pk))

    def change(old: str):
        return client.post("/admin/password_change/", {"old_password": old, "new_password1": "New-pass-for-review-2",
                                                        "new_password2": "New-pass-for-review-2"})

    try:
        for guess in ("guess-1", "guess-2"):
            assert change(guess).status_code == 200
        response = change(staff.test_password)
        assert response.status_code == 200 and THROTTLED in response.content.decode()
        assert User.objects.get(pk=staff.pk).check_password(staff.test_password)
    finally:
        ratelimit.login_reset(username=staff.username, address=address)


def _staff_with(make_user, *codenames: str):
    from django.contrib.auth.models import Permission

    from jobs.models import User

    staff = make_user("helpdesk")
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(User.objects.get(pk=staff.pk))
    return User.objects.get(pk=staff.pk), client


def _change_form_data(client: Client, user) -> dict:
    page = client.get(f"/admin/jobs/user/{user.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None and name in form.fields
            and name not in ("password", "groups", "user_permissions", "last_login", "date_joined",
                             "is_active", "is_staff", "is_superuser")}
    data.update({"date_joined_0": "2024-01-01", "date_joined_1": "00:00:00", "is_active": "on", "is_staff": "on"})
    return data


def test_a_staff_user_who_may_change_users_cannot_make_themselves_an_admin(make_user):
    """Staff is no portal right (finding 13), but Django's user page lets
    whoever may change users tick their own superuser box or give
    themselves jobs.administer_portal."""
    from django.contrib.auth.models import Permission

    from jobs.models import User

    staff, client = _staff_with(make_user, "view_user", "change_user")
    admin_right = Permission.objects.get(codename="administer_portal")
    data = {**_change_form_data(client, staff), "is_superuser": "on", "user_permissions": [admin_right.pk]}
    client.post(f"/admin/jobs/user/{staff.pk}/change/", data)
    staff = User.objects.get(pk=staff.pk)
    assert not staff.is_superuser and not staff.is_admin


def test_a_staff_user_who_may_change_users_cannot_take_over_an_admin(make_user, admin_user):
    """... nor set a superuser's password, and sign in as them."""
    from jobs.models import User

    staff, client = _staff_with(make_user, "view_user", "change_user")
    before = User.objects.get(pk=admin_user.pk).password
    response = client.post(f"/admin/jobs/user/{admin_user.pk}/password/", {
        "password1": "Taken-over-pass-9", "password2": "Taken-over-pass-9", "usable_password": "true"})
    assert response.status_code == 403
    assert User.objects.get(pk=admin_user.pk).password == before


def test_a_staff_user_who_may_change_users_still_changes_plain_users(make_user, alice):
    from jobs.models import User

    staff, client = _staff_with(make_user, "view_user", "change_user")
    data = {**_change_form_data(client, alice), "email": "alice@example.org"}
    data.pop("is_staff")
    response = client.post(f"/admin/jobs/user/{alice.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    alice = User.objects.get(pk=alice.pk)
    assert alice.email == "alice@example.org" and not alice.is_staff


def test_a_staff_user_who_may_change_groups_cannot_give_their_group_the_admin_right(make_user):
    from django.contrib.auth.models import Group, Permission

    from jobs.models import User

    staff, client = _staff_with(make_user, "view_group", "change_group")
    group = Group.objects.create(name=f"helpers-of-{staff.username}")
    staff.groups.add(group)
    admin_right = Permission.objects.get(codename="administer_portal")
    client.post(f"/admin/auth/group/{group.pk}/change/", {"name": group.name, "permissions": [admin_right.pk]})
    assert not group.permissions.exists()
    assert not User.objects.get(pk=staff.pk).is_admin
    group.delete()


def test_a_portal_admin_still_gives_rights_in_the_django_admin(make_user, admin_user, alice):
    from django.contrib.auth.models import Permission

    from jobs.models import User

    client = Client()
    client.force_login(admin_user)
    admin_right = Permission.objects.get(codename="administer_portal")
    data = {**_change_form_data(client, alice), "user_permissions": [admin_right.pk]}
    assert client.post(f"/admin/jobs/user/{alice.pk}/change/", data).status_code == 302
    assert User.objects.get(pk=alice.pk).is_admin
