"""Finding 42: a task host could set the portal's cookies. A page may set a
cookie for any parent domain of its host, and the browser sends it to every
host under that domain: with PORTAL_PROXY_DOMAIN the portal's own host name,
a parent of it or under it (jobs.pai.example.org beside pai.example.org),
a job's page set `csrftoken` (passing the portal's CSRF check for a form of
the job's choosing) or a `sessionid` of the attacker's (the victim working
in the attacker's account). SECURITY.md said to use a domain of its own;
nothing checked it, and a sibling under one registrable domain
(jobs.example.org beside pai.example.org) cannot be told apart from names
alone.

Now the portal refuses to start with a proxy domain that is, contains or is
contained in one of its own host names (but `localhost`, for which browsers
set no cookie), and under HTTPS its session and CSRF cookies are named
`__Host-...`: the browser takes such a cookie only from the host itself
(Secure, Path=/, no Domain), so no other host, sibling or not, can set one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def _manage(*args: str, **environ: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PORTAL_", "DJANGO_"))}
    base.update(environ)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=base, capture_output=True, text=True,
                          timeout=120)


def _settings(tmp_path, **environ: str) -> subprocess.CompletedProcess:
    return _manage("shell", "--no-imports", "-c", "from django.conf import settings; "
                   "print(settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME)",
                   PORTAL_VAR_DIR=str(tmp_path), PORTAL_SECRET_KEY="a-long-random-production-secret-" + "k9Z" * 20,
                   **environ)


@pytest.mark.parametrize("proxy,portal", [
    ("pai.example.org", {"PORTAL_ALLOWED_HOSTS": "pai.example.org"}),  # the portal's own host
    ("example.org", {"PORTAL_ALLOWED_HOSTS": "pai.example.org"}),  # a parent of it
    ("jobs.pai.example.org", {"PORTAL_ALLOWED_HOSTS": "pai.example.org"}),  # under it
    ("jobs.example.org", {"PORTAL_ALLOWED_HOSTS": ".example.org"}),  # under a domain the portal answers for
    ("jobs.pai.example.org", {"PORTAL_ALLOWED_HOSTS": "10.0.0.5", "PORTAL_URL": "https://pai.example.org"}),
    ("jobs.example.org", {"PORTAL_ALLOWED_HOSTS": "10.0.0.5", "PORTAL_CSRF_TRUSTED_ORIGINS": "https://*.example.org"}),
])
def test_it_refuses_a_proxy_domain_that_shares_the_portals_host_names(tmp_path, proxy, portal):
    result = _settings(tmp_path, PORTAL_PROXY_DOMAIN=proxy, **portal)
    assert result.returncode != 0, result.stdout
    assert "PORTAL_PROXY_DOMAIN" in result.stderr and "cookies" in result.stderr


@pytest.mark.parametrize("proxy,hosts", [
    ("pai-jobs.example.net", "pai.example.org"),
    ("localhost", "127.0.0.1,localhost,[::1]"),  # browsers set no cookie for all of localhost
])
def test_it_starts_with_a_proxy_domain_of_its_own(tmp_path, proxy, hosts):
    result = _settings(tmp_path, PORTAL_PROXY_DOMAIN=proxy, PORTAL_ALLOWED_HOSTS=hosts)
    assert result.returncode == 0, result.stderr


def test_it_names_its_cookies_for_its_host_alone_under_https(tmp_path):
    https = _settings(tmp_path, PORTAL_HTTPS="1", PORTAL_ALLOWED_HOSTS="pai.example.org")
    assert https.returncode == 0, https.stderr
    assert https.stdout.split() == ["__Host-sessionid", "__Host-csrftoken"]
    # Over plain HTTP a __Host- cookie would not be set at all (it must be Secure).
    plain = _settings(tmp_path, PORTAL_ALLOWED_HOSTS="pai.example.org")
    assert plain.stdout.split() == ["sessionid", "csrftoken"]
    deploy = _manage("check", "--deploy", "--fail-level", "WARNING", PORTAL_VAR_DIR=str(tmp_path),
                     PORTAL_SECRET_KEY="a-long-random-production-secret-" + "k9Z" * 20, PORTAL_HTTPS="1",
                     PORTAL_ALLOWED_HOSTS="portal.example.org")
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
