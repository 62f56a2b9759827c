"""One user holds at most MAX_LIVE_TOKENS_PER_USER live API tokens: the next
is refused through POST /api/v1/token (409 TooManyTokensError) and on the
Profile page (a message, no token), while other users, expired and revoked
tokens, and the tokens already held are unaffected. Dead tokens kept are
bounded too, so making and revoking in turn does not grow the table.

Users: alice (at the limit), bob (another user); each test makes its own.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import ApiToken
from jobs.services import tokens

LIMIT = tokens.MAX_LIVE_TOKENS_PER_USER


def _fill(user, count: int, **fields) -> None:
    """`count` tokens of `user`, written at once (their secrets are not needed)."""
    now = timezone.now()
    ApiToken.objects.bulk_create(
        ApiToken(user=user, key_hash=tokens.key_hash(f"{user.pk} {fields.get('label')} {n}"), prefix="pai_fill",
                 created_at=now, expires_at=fields.get("expires_at", now + timedelta(hours=1)),
                 revoked_at=fields.get("revoked_at"), label=fields.get("label", "filler"))
        for n in range(count))


def _login(user) -> tuple[int, dict]:
    response = Client().post("/api/v1/token", json.dumps({"username": user.username, "password": user.test_password}),
                             content_type="application/json")
    return response.status_code, response.json()


def test_the_api_refuses_a_token_past_the_limit_and_keeps_the_others(alice, bob):
    _fill(alice, 3, label="expired", expires_at=timezone.now() - timedelta(seconds=1))
    _fill(alice, 3, label="revoked", revoked_at=timezone.now())
    _fill(alice, LIMIT - 1)
    status, answer = _login(alice)  # the last one allowed; dead tokens do not count
    assert status == 200, answer
    kept = answer["token"]

    status, answer = _login(alice)
    assert status == 409 and answer["code"] == "TooManyTokensError", answer
    assert str(LIMIT) in answer["message"] and "revoke" in answer["message"]
    assert ApiToken.objects.filter(user=alice, revoked_at__isnull=True, expires_at__gt=timezone.now()).count() == LIMIT
    # The tokens held still work, and another user is not affected.
    assert Client().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {kept}").status_code == 200
    assert _login(bob)[0] == 200

    # A revoked one frees a place.
    assert tokens.token_revoke(token=ApiToken.objects.filter(user=alice, label="filler").first())
    assert _login(alice)[0] == 200


def test_the_profile_page_refuses_a_token_past_the_limit(alice, bob):
    _fill(alice, LIMIT)
    client = Client()
    client.force_login(alice)
    page = client.post(reverse("jobs:token_create"), {"label": "one more", "days": 30}, follow=True)
    assert page.status_code == 200
    text = page.content.decode()
    assert "The token was not created" in text and str(LIMIT) in text
    assert not ApiToken.objects.filter(user=alice, label="one more").exists()

    other = Client()
    other.force_login(bob)
    assert other.post(reverse("jobs:token_create"), {"label": "bob's", "days": 30}).status_code == 302
    assert ApiToken.objects.filter(user=bob, label="bob's").exists()


def test_an_anonymous_client_makes_no_token(alice):
    _fill(alice, LIMIT)
    response = Client().post(reverse("jobs:token_create"), {"label": "anon", "days": 30})
    assert response.status_code == 302 and "/login" in response["Location"]
    answer = Client().post("/api/v1/token", json.dumps({"username": alice.username, "password": "wrong"}),
                           content_type="application/json").json()
    assert answer["code"] == "IncorrectPasswordError"  # the limit tells a stranger nothing
    assert not ApiToken.objects.filter(label="anon").exists()


def test_making_and_revoking_tokens_in_turn_keeps_a_bounded_number_of_rows(alice):
    # The live limit alone is no bound: a token revoked (or expired) at once
    # frees its place, and was kept for KEEP_DEAD_TOKENS (30 days). The
    # Profile page makes a token without a password, so a loop of make and
    # revoke grew the table by a row per turn.
    client = Client()
    client.force_login(alice)
    turns = 150
    for turn in range(turns):
        assert client.post(reverse("jobs:token_create"), {"label": f"turn {turn}", "days": 1}).status_code == 302
        made = ApiToken.objects.filter(user=alice, revoked_at__isnull=True).get()
        assert client.post(reverse("jobs:token_revoke", args=[made.pk])).status_code == 302
    held = ApiToken.objects.filter(user=alice).count()
    assert held <= tokens.MAX_DEAD_TOKENS_KEPT + 1 < turns, held
    # The newest are the ones kept, for the owner's list.
    assert ApiToken.objects.filter(user=alice, label=f"turn {turns - 1}").exists()
