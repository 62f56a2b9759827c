"""Review of virtual clusters, users, limits and tokens: what the Django
admin, management commands and the API let through that the services'
own rules refuse. Through Django's test client, on the test database."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import Job, User
from jobs.services import tokens
from tests.helpers import admin_delete, config, role, submit


def _admin_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _parked(user: User, name: str) -> Job:
    """A job that waits for ever: no node has its GPU type."""
    return submit(user, config(name, role(command="true", gpus=1), gpuType="NOWHEREREVIEW"))


@pytest.mark.parametrize("how", ["delete page", "bulk action"])
def test_the_django_admin_keeps_a_user_with_unfinished_jobs(admin_user, alice, how):
    """Deleting a user takes their jobs with them (a cascade): an unfinished
    job's row would go while its containers run on. DELETE /user refuses;
    the Django admin must too, and say why."""
    job = _parked(alice, "still-waiting")
    client = _admin_client(admin_user)
    response = admin_delete(client, "jobs/user", alice.pk, how)
    assert response.status_code == 200, response.status_code
    assert str(job) in response.content.decode()
    assert User.objects.filter(pk=alice.pk).exists()
    assert Job.objects.filter(pk=job.pk).exists()


def test_the_django_admin_deletes_a_user_whose_jobs_have_all_ended(admin_user, alice):
    job = _parked(alice, "ended")
    from jobs import services
    services.job_stop(job=job, by=alice)
    response = _admin_client(admin_user).post(f"/admin/jobs/user/{alice.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not User.objects.filter(pk=alice.pk).exists()


def test_a_password_changed_on_the_django_admins_own_page_revokes_the_users_tokens(make_user):
    """/admin/password_change/ (any staff user's own password) is a change
    like PUT /user's and the admin's reset: a token taken with the old
    password must stop working."""
    from datetime import timedelta

    from jobs.services import tokens

    staff = make_user("staffer", password="Old-pass-for-review-1")
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    key = tokens.token_create(user=staff, lifetime=timedelta(hours=1)).key
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    assert Client().get(f"/api/v1/user/{staff.username}", **bearer).status_code == 200
    response = _admin_client(User.objects.get(pk=staff.pk)).post("/admin/password_change/", {
        "old_password": "Old-pass-for-review-1", "new_password1": "New-pass-for-review-2",
        "new_password2": "New-pass-for-review-2"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Client().get(f"/api/v1/user/{staff.username}", **bearer).status_code == 401


def test_djangos_own_changepassword_command_revokes_the_users_tokens(make_user, monkeypatch):
    """SECURITY.md: a password change revokes the user's tokens. Django's
    `manage.py changepassword` (its own command, not ours) left them
    working, for up to a year."""
    from datetime import timedelta

    from django.contrib.auth.management.commands import changepassword
    from django.core.management import call_command

    from jobs.services import tokens

    user = make_user("changer", password="Old-pass-for-review-1")
    key = tokens.token_create(user=user, lifetime=timedelta(hours=1)).key
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    assert Client().get(f"/api/v1/user/{user.username}", **bearer).status_code == 200
    monkeypatch.setattr(changepassword.getpass, "getpass", lambda prompt="": "New-pass-for-review-2")
    call_command("changepassword", user.username, stdout=io.StringIO())
    assert User.objects.get(pk=user.pk).check_password("New-pass-for-review-2")
    assert Client().get(f"/api/v1/user/{user.username}", **bearer).status_code == 401


def test_the_django_admin_neither_deletes_nor_renames_the_default_virtual_cluster(admin_user):
    """"default" always exists: submissions without a virtual cluster go
    there, and it gets the share the others leave. Deleted (it may hold no
    jobs) or renamed, submissions fail and the renamed one keeps default's
    stored 100 % beside the others' shares until the next restart."""
    from jobs.models import VirtualCluster

    default = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)
    client = _admin_client(admin_user)
    assert client.post(f"/admin/jobs/virtualcluster/{default.pk}/delete/", {"post": "yes"}).status_code == 403
    response = client.post("/admin/jobs/virtualcluster/", {"action": "delete_selected",
                                                            "_selected_action": [default.pk], "post": "yes"})
    assert response.status_code in (200, 403)  # 200: the page naming its jobs, which protect it too
    assert VirtualCluster.objects.filter(pk=default.pk).exists()
    client.post(f"/admin/jobs/virtualcluster/{default.pk}/change/", {
        "name": "renamed_default", "capacity": "100", "description": "", "open_to_all": "on"})
    assert VirtualCluster.objects.filter(pk=default.pk, name=VirtualCluster.DEFAULT).exists()


def test_the_django_admin_refuses_shares_over_the_whole_cluster_naming_the_field(admin_user):
    """Shares are percentages of one cluster: two of 80 % would each be
    promised what the other holds (and "default" left with nothing), so
    the scheduler could keep neither promise."""
    from jobs.models import VirtualCluster
    from tests.conftest import unique

    # Earlier tests' virtual clusters give their shares up for this one.
    kept = dict(VirtualCluster.objects.exclude(name=VirtualCluster.DEFAULT).values_list("pk", "capacity"))
    VirtualCluster.objects.filter(pk__in=kept).update(capacity=0.0)
    first = VirtualCluster.objects.create(name=unique("share_a"), capacity=0.0)
    second = VirtualCluster.objects.create(name=unique("share_b"), capacity=80.0)
    client = _admin_client(admin_user)
    try:
        response = client.post(f"/admin/jobs/virtualcluster/{first.pk}/change/", {
            "name": first.name, "capacity": "80", "description": ""})
        assert response.status_code == 200
        assert "capacity" in response.context["adminform"].form.errors
        first.refresh_from_db()
        assert first.capacity == 0.0
        response = client.post(f"/admin/jobs/virtualcluster/{first.pk}/change/", {
            "name": first.name, "capacity": "20", "description": ""})
        assert response.status_code == 302
        first.refresh_from_db()
        assert first.capacity == 20.0
    finally:
        VirtualCluster.objects.filter(pk__in=[first.pk, second.pk]).delete()
        for pk, capacity in kept.items():
            VirtualCluster.objects.filter(pk=pk).update(capacity=capacity)


def test_no_way_in_makes_a_second_user_whose_name_differs_only_in_case(admin_user, alice, bob):
    """PUT /user refuses "ALICE" beside "alice" (ConflictUserError); the
    command line and the Django admin's user page must too, or two
    accounts share one login throttle and one name in every list."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="already exists"):
        call_command("createuser", alice.username.upper(), "--generate-password")
    assert User.objects.filter(username__iexact=alice.username).count() == 1
    client = _admin_client(admin_user)
    page = client.get(f"/admin/jobs/user/{bob.pk}/change/")
    form = page.context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None and name not in
            ("password", "groups", "user_permissions", "last_login", "date_joined")}
    data.update({"username": alice.username.upper(), "date_joined_0": "2024-01-01", "date_joined_1": "00:00:00"})
    response = client.post(f"/admin/jobs/user/{bob.pk}/change/", data)
    assert response.status_code == 200
    assert "already exists (in another case)" in str(response.context["adminform"].form.errors)
    bob.refresh_from_db()
    assert bob.username != alice.username.upper()


def test_the_database_itself_refuses_a_name_that_differs_only_in_case(alice):
    """The checks above run before the INSERT: two requests at once could
    both pass them (PostgreSQL runs them side by side). The database's own
    constraint is what holds then, and PUT /user answers it as a conflict."""
    from django.db import IntegrityError, transaction

    from jobs.services import users

    with pytest.raises(IntegrityError), transaction.atomic():
        User.objects.create(username=alice.username.upper())
    with pytest.raises(users.UserError) as refused:
        users.user_create(username=alice.username.upper(), password="a-Long-enough-pass-1")
    assert refused.value.code == "ConflictUserError"
    assert User.objects.filter(username__iexact=alice.username).count() == 1


def test_a_virtual_cluster_made_while_the_usage_is_read_is_shown_next_time_not_a_500(alice):
    # vc_usage reads the virtual clusters for the quotas and then again for
    # the list: one made between the two reads had no quota (a KeyError).
    from django.db import connection

    from jobs.models import VirtualCluster
    from jobs.services import vc_usage

    made: list[VirtualCluster] = []

    def an_admin_adds_one_meanwhile(execute, sql, params, many, context):
        if not made and "jobs_gpuallocation" in sql:  # the quotas' last read, after their virtual clusters
            made.append(VirtualCluster.objects.create(name=f"meanwhile{alice.pk}", capacity=0))
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(an_admin_adds_one_meanwhile):
            names = [usage.name for usage in vc_usage()]
        assert made and "default" in names
        assert made[0].name in [usage.name for usage in vc_usage()]
    finally:
        VirtualCluster.objects.filter(pk__in=[vc.pk for vc in made]).delete()
    client = Client()
    client.force_login(alice)
    assert client.get("/virtual-clusters/").status_code == 200


def test_a_staff_user_allowed_to_change_tokens_cannot_move_one_to_another_user_or_revive_it(make_user, admin_user):
    # A staff user given "change api token" (not the portal-admin right)
    # moved their own token, whose secret they hold, to a superuser.
    from django.contrib.auth.models import Permission

    from jobs.models import ApiToken

    staff = make_user("tokenstaff", password="Staff-pass-for-review-1")
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=("change_apitoken", "view_apitoken")))
    made = tokens.token_create(user=staff, lifetime=timedelta(hours=1))
    client = _admin_client(User.objects.get(pk=staff.pk))
    page = client.get(f"/admin/jobs/apitoken/{made.token.pk}/change/")
    assert page.status_code == 200
    client.post(f"/admin/jobs/apitoken/{made.token.pk}/change/", {
        "user": admin_user.pk, "label": "moved", "created_at_0": "2026-01-01", "created_at_1": "00:00:00",
        "expires_at_0": "2099-01-01", "expires_at_1": "00:00:00"})
    token = ApiToken.objects.get(pk=made.token.pk)
    assert token.user_id == staff.pk and token.expires_at < timezone.now() + timedelta(hours=2)
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {made.key}"}
    assert Client().get(f"/api/v1/user/{admin_user.username}/", **bearer).status_code in (403, 404)
    # Revoked for good: no way back through the admin.
    tokens.token_revoke(token=token)
    client.post(f"/admin/jobs/apitoken/{made.token.pk}/change/", {"user": staff.pk, "label": "back",
                                                                   "revoked_at_0": "", "revoked_at_1": ""})
    assert ApiToken.objects.get(pk=made.token.pk).revoked_at is not None
    assert Client().get(f"/admin/jobs/apitoken/{made.token.pk}/change/").status_code == 302  # anonymous: to login


def test_the_django_admin_revokes_tokens_by_its_action(admin_user, alice):
    from jobs.models import ApiToken

    made = tokens.token_create(user=alice, lifetime=timedelta(hours=1))
    response = _admin_client(admin_user).post("/admin/jobs/apitoken/", {
        "action": "revoke", "_selected_action": [made.token.pk]})
    assert response.status_code == 302
    assert ApiToken.objects.get(pk=made.token.pk).revoked_at is not None
    assert Client().get(f"/api/v1/user/{alice.username}", HTTP_AUTHORIZATION=f"Bearer {made.key}").status_code == 401
    assert _admin_client(alice).post("/admin/jobs/apitoken/", {"action": "revoke"}).status_code == 302  # to login
