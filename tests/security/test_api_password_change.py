"""Finding 9: `PUT /api/v1/user` with `modify: true` changed the caller's
own password without the current one, and old tokens and sessions kept
working. Now one's own password (admins' too) needs `oldPassword`, an admin
may still reset another user's, and a change revokes the user's other
tokens and ends their browser sessions."""

from __future__ import annotations

import json
from datetime import timedelta

from django.test import Client

from jobs.services import tokens

OLD = "pw-for-tests-1"  # make_user's password
NEW = "a-New-long-pass-phrase-9"


def _token(user) -> str:
    return tokens.token_create(user=user, lifetime=timedelta(hours=1), label="t").key


def _put_user(token: str | None, body: dict):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return Client().put("/api/v1/user", data=json.dumps(body), content_type="application/json", **headers)


def _api_ok(token: str) -> bool:
    return Client().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


def test_it_refuses_a_change_of_ones_own_password_without_the_current_one(alice):
    token = _token(alice)
    body = {"username": alice.username, "password": NEW, "modify": True}
    missing = _put_user(token, body)
    assert missing.status_code == 400 and "oldPassword" in missing.json()["message"]
    wrong = _put_user(token, {**body, "oldPassword": "not-it"})
    assert wrong.status_code == 403 and wrong.json()["code"] == "ForbiddenUserError"
    alice.refresh_from_db()
    assert alice.check_password(OLD)


def test_it_revokes_other_tokens_and_sessions_when_the_password_changes(alice):
    calling, other = _token(alice), _token(alice)
    browser = Client()
    browser.force_login(alice)
    assert browser.get("/").status_code == 200
    answer = _put_user(calling, {"username": alice.username, "password": NEW, "modify": True, "oldPassword": OLD})
    assert answer.status_code == 201, answer.content
    alice.refresh_from_db()
    assert alice.check_password(NEW)
    assert _api_ok(calling)
    assert not _api_ok(other)
    assert browser.get("/").status_code == 302  # back to the login page


def test_it_lets_an_admin_reset_another_users_password_but_not_their_own_without_it(alice, admin_user):
    admin_token, alice_token = _token(admin_user), _token(alice)
    reset = _put_user(admin_token, {"username": alice.username, "password": NEW, "modify": True})
    assert reset.status_code == 201, reset.content
    assert not _api_ok(alice_token)
    own = _put_user(admin_token, {"username": admin_user.username, "password": NEW, "modify": True})
    assert own.status_code == 400


def test_it_refuses_another_user_and_an_anonymous_client(alice, bob):
    body = {"username": alice.username, "password": NEW, "modify": True, "oldPassword": OLD}
    assert _put_user(_token(bob), body).status_code == 403
    assert _put_user(None, body).status_code == 401
    alice.refresh_from_db()
    assert alice.check_password(OLD)
