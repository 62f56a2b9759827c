"""Review of authentication and sessions: logins, tokens, sessions, the
Django admin for staff, as a hostile user would try them."""

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
