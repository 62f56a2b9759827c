"""Findings 22-24 and 26: ways around the failed-login limit (a username spelled
another way the login forms read as the same; the current password asked
by a password change, guessed with a stolen token or session), and a staff
user who may change users or groups giving themselves a portal admin's
rights or taking over an admin in the Django admin, or who may change SSH
keys or jobs acting for another account."""

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


# Finding 26: a staff user acting for another account through the Django
# admin's models that belong to a user (SSH keys, jobs).

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl staff@laptop"
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ7eS0QlyLq1NtEp0aDC6EbYb1x7gS1l3mPcOp1vQ2aG alice@laptop"
KEY_RIGHTS = ("view_sshkey", "add_sshkey", "change_sshkey", "delete_sshkey")


@pytest.mark.parametrize("victim", ["admin_user", "alice"])
def test_a_staff_user_who_may_add_ssh_keys_cannot_add_one_to_another_account(make_user, victim, request):
    """The key would be authorized in the victim's next task containers:
    an SSH login as them, to their code, data and secrets."""
    from jobs.models import SshKey

    owner = request.getfixturevalue(victim)
    staff, client = _staff_with(make_user, *KEY_RIGHTS)
    response = client.post("/admin/jobs/sshkey/add/", {"user": owner.pk, "title": "mine", "public_key": KEY,
                                                       "fingerprint": "", "created_at_0": "2024-01-01",
                                                       "created_at_1": "00:00:00"})
    assert response.status_code == 200  # the form again, naming the field
    assert "user" in response.context["adminform"].form.errors
    assert not SshKey.objects.filter(user=owner).exists()


def test_a_staff_user_who_may_change_ssh_keys_cannot_see_move_or_delete_anothers(make_user, alice):
    from jobs.models import SshKey
    from jobs.services import access

    theirs = access.ssh_key_add(user=alice, title="laptop", public_key=OTHER_KEY)
    staff, client = _staff_with(make_user, *KEY_RIGHTS)
    mine = access.ssh_key_add(user=staff, title="mine", public_key=KEY)
    listing = client.get("/admin/jobs/sshkey/").content.decode()
    assert "mine" in listing and "laptop" not in listing
    assert client.get(f"/admin/jobs/sshkey/{theirs.pk}/change/").status_code in (302, 404)
    client.post(f"/admin/jobs/sshkey/{theirs.pk}/delete/", {"post": "yes"})
    client.post("/admin/jobs/sshkey/", {"action": "delete_selected", "_selected_action": [theirs.pk], "post": "yes"})
    assert SshKey.objects.filter(pk=theirs.pk).exists()
    # Their own key, given to alice by a crafted POST.
    client.post(f"/admin/jobs/sshkey/{mine.pk}/change/", {"user": alice.pk, "title": "mine", "public_key": KEY,
                                                           "fingerprint": mine.fingerprint,
                                                           "created_at_0": "2024-01-01", "created_at_1": "00:00:00"})
    assert SshKey.objects.get(pk=mine.pk).user_id == staff.pk


def test_a_staff_user_who_may_add_ssh_keys_adds_their_own_and_an_admin_anyones(make_user, admin_user, alice):
    from jobs.models import SshKey

    staff, client = _staff_with(make_user, *KEY_RIGHTS)
    data = {"title": "laptop", "public_key": KEY, "created_at_0": "2024-01-01", "created_at_1": "00:00:00"}
    response = client.post("/admin/jobs/sshkey/add/", {**data, "user": staff.pk})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert SshKey.objects.get(user=staff).fingerprint.startswith("SHA256:")
    admins = Client()
    admins.force_login(admin_user)
    assert admins.post("/admin/jobs/sshkey/add/", {**data, "user": alice.pk}).status_code == 302
    assert SshKey.objects.filter(user=alice).exists()


def test_the_django_admin_refuses_a_key_that_is_not_one_public_key_line(admin_user, alice):
    """What is stored is written into authorized_keys: a second line or
    options before the key would be more than the key the page shows."""
    from jobs.models import SshKey

    client = Client()
    client.force_login(admin_user)
    for bad in (KEY + "\n" + OTHER_KEY, 'command="sh" ' + KEY, "not a key"):
        response = client.post("/admin/jobs/sshkey/add/", {"user": alice.pk, "title": "x", "public_key": bad,
                                                           "created_at_0": "2024-01-01", "created_at_1": "00:00:00"})
        assert response.status_code == 200 and "public_key" in response.context["adminform"].form.errors
    assert not SshKey.objects.filter(user=alice).exists()


def test_a_staff_user_who_may_change_jobs_cannot_give_a_job_another_owner(make_user, alice):
    """A job starts with its owner's SSH keys, storage and name: moving
    alice's waiting job to oneself lets one log in to it; one's own job to
    alice runs it as her."""
    from jobs.models import Job
    from tests.helpers import config, role, submit

    staff, client = _staff_with(make_user, "view_job", "change_job", "add_job")
    job = submit(alice, config("moved", role(command="true", gpus=1), gpuType="NOWHERESTAFF"))
    page = client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert "owner" not in form.fields
    data = {name: form[name].value() for name in form.fields}
    data = {name: value for name, value in data.items() if value is not None}
    client.post(f"/admin/jobs/job/{job.pk}/change/", {**data, "owner": staff.pk})
    assert Job.objects.get(pk=job.pk).owner_id == alice.pk
    assert client.get("/admin/jobs/job/add/").status_code == 403
