"""Finding 8: /admin/login/ had no throttle (30 wrong passwords in a row
were all answered normally), while anyone could lock any user out of
/login/ by failing on purpose. Both logins now share one limit, keyed by
username and client address, by address, and by username over all
addresses except the places the user logged in from before."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.services import ratelimit

LOGINS = ["/login/", "/admin/login/"]
THROTTLED = "Too many failed logins"


def _login(path: str, user, password: str, address: str) -> tuple[bool, str]:
    client = Client(REMOTE_ADDR=address)
    response = client.post(path, {"username": user.username, "password": password, "next": "/"})
    return "_auth_user_id" in client.session, response.content.decode()


@pytest.fixture
def one_failure_allowed(settings):
    settings.LOGIN_FAILURES_ALLOWED = 1
    yield
    ratelimit.login_reset(address="198.51.100.1")


@pytest.mark.parametrize("path", LOGINS)
def test_it_throttles_wrong_passwords_on_both_logins(path, admin_user, one_failure_allowed):
    address = "198.51.100.1"
    ratelimit.login_reset(username=admin_user.username, address=address)
    ok, page = _login(path, admin_user, "wrong", address)
    assert not ok and THROTTLED not in page
    ok, page = _login(path, admin_user, admin_user.test_password, address)
    assert not ok and THROTTLED in page  # the right password waits too: no answer leaks


@pytest.mark.parametrize("path", LOGINS)
def test_it_does_not_let_a_stranger_lock_a_user_out_from_elsewhere(path, admin_user, one_failure_allowed):
    home, attacker = "198.51.100.10", "203.0.113.66"
    assert _login(path, admin_user, admin_user.test_password, home)[0]
    for _ in range(3):
        _login(path, admin_user, "guess", attacker)
    assert THROTTLED in _login(path, admin_user, admin_user.test_password, attacker)[1]
    assert _login(path, admin_user, admin_user.test_password, home)[0]


@pytest.mark.parametrize("path", LOGINS)
def test_it_stops_guessing_spread_over_many_addresses_but_not_the_owner(path, admin_user, one_failure_allowed):
    home = "198.51.100.20"
    assert _login(path, admin_user, admin_user.test_password, home)[0]
    for n in range(ratelimit.USERNAME_FACTOR):
        _login(path, admin_user, "guess", f"203.0.113.{n + 1}")
    ok, page = _login(path, admin_user, admin_user.test_password, "192.0.2.200")
    assert not ok and THROTTLED in page
    assert _login(path, admin_user, admin_user.test_password, home)[0]


def test_it_counts_the_real_client_address_not_one_a_client_claims(cluster, admin_user, settings):
    """uvicorn believed X-Forwarded-For from loopback clients, so a client of
    a portal on 127.0.0.1 could pick the address each failure counted under."""
    import requests

    from tests.helpers import csrf_token

    def attempt(password: str, claimed: str) -> str:
        web = requests.Session()
        page = web.get(f"{cluster.base_url}/login/", timeout=30)
        return web.post(f"{cluster.base_url}/login/", timeout=30, headers={
            "X-Forwarded-For": claimed, "Referer": f"{cluster.base_url}/login/"}, data={
            "username": admin_user.username, "password": password, "csrfmiddlewaretoken": csrf_token(page.text)}).text

    try:
        for n in range(settings.LOGIN_FAILURES_ALLOWED):
            assert THROTTLED not in attempt("guess", f"203.0.113.{n + 1}")
        assert THROTTLED in attempt(admin_user.test_password, "198.51.100.99")
    finally:
        ratelimit.login_reset(username=admin_user.username, address="127.0.0.1")
