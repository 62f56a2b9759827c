"""Finding 13: `is_staff` alone granted full portal admin. Portal admin is
now an explicit right: a superuser, or the `jobs.administer_portal`
permission (given to the user or to one of their groups)."""

from __future__ import annotations

import json
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


def test_it_takes_the_right_away_at_once_when_the_granting_group_is_deleted(make_user):
    # Deleting the group removes the membership by cascade, which sends no
    # m2m_changed: the remembered answer must go all the same.
    user = make_user("grouped")
    group = Group.objects.create(name=f"admins-of-{user.username}")
    group.permissions.add(_permission())
    user.groups.add(group)
    key = tokens.token_create(user=User.objects.get(pk=user.pk), lifetime=timedelta(hours=1)).key
    client = Client()
    assert client.get("/api/v1/user", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    group.delete()
    assert client.get("/api/v1/user", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 403


def _put_user(by: User, **body) -> tuple[int, dict]:
    key = tokens.token_create(user=by, lifetime=timedelta(hours=1)).key
    response = Client().put("/api/v1/user", json.dumps(body), content_type="application/json",
                            HTTP_AUTHORIZATION=f"Bearer {key}")
    return response.status_code, response.json()


def test_the_api_takes_admin_rights_away_whichever_way_they_were_given(make_user, admin_user):
    granted = make_user("granted")
    granted.user_permissions.add(_permission())
    status, _ = _put_user(admin_user, username=granted.username, admin=False, modify=True)
    assert status == 201
    assert not User.objects.get(pk=granted.pk).is_admin
    assert _api(User.objects.get(pk=granted.pk), "/api/v1/user") == 403


def test_the_api_refuses_to_demote_an_admin_of_a_group_and_changes_nothing(make_user, admin_user):
    # Answering "done" while the group still makes them admin would be a lie;
    # the password asked for in the same call stays as it was.
    member = make_user("member")
    group = Group.objects.create(name=f"admins-of-{member.username}")
    group.permissions.add(_permission())
    member.groups.add(group)
    before = User.objects.get(pk=member.pk).password
    status, body = _put_user(admin_user, username=member.username, admin=False, modify=True,
                             password="a-new-long-password-9")
    assert status == 409 and body["code"] == "ConflictUserError"
    assert group.name in body["message"]
    member = User.objects.get(pk=member.pk)
    assert member.is_admin and member.password == before


def test_the_task_queues_are_for_portal_admins_only(make_user, admin_user):
    # django-rq itself lets in any is_staff user; its queues hold every
    # user's job names and the nodes' launch and stop requests.
    from jobs import queues

    staff = make_user("staff")
    User.objects.filter(pk=staff.pk).update(is_staff=True, is_superuser=False)
    staff = User.objects.get(pk=staff.pk)
    plain = make_user("plain")
    queues.enqueue_notification({"job_id": 1, "owner_id": 2, "job_name": "someones-private-job", "state": "FAILED"})
    queue = queues._queue(queues.notify_queue_name())
    rq_job = queue.jobs[-1]
    paths = ["/admin/rq/", "/admin/rq/stats.json", "/admin/rq/queues/0/", f"/admin/rq/queues/0/{rq_job.id}/",
             "/admin/rq/workers/0/"]
    for user in (staff, plain):
        for path in paths:
            assert _page(user, path) == 403, (user.username, path)
        client = Client()
        client.force_login(user)
        assert client.post(f"/admin/rq/queues/0/{rq_job.id}/delete/").status_code == 403
        assert rq_job.id in queue.job_ids
    for path in paths:
        response = Client().get(path)
        assert response.status_code == 302 and response["Location"].startswith(("/login/", "/admin/login/")), path
    assert _page(admin_user, "/admin/rq/") == 200
    assert _page(admin_user, f"/admin/rq/queues/0/{rq_job.id}/") == 200
    rq_job.delete()
