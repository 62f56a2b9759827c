"""Every page of the portal carries a Content-Security-Policy that lets
only the portal's own scripts run: each inline script a page holds is
allowed by its hash, and no page uses inline event handlers (which a hash
cannot allow). The browser tests run every page's scripts under it."""

from __future__ import annotations

import base64
import hashlib
import re

from django.test import Client

from tests.test_pages import ended_job, task_attempt

INLINE_SCRIPT = re.compile(r"<script(?P<attrs>[^>]*)>(?P<body>.*?)</script>", re.DOTALL)
EVENT_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.IGNORECASE)


def _allowed_scripts(policy: str) -> set[str]:
    directive = next(d.strip() for d in policy.split(";") if d.strip().startswith("script-src "))
    return set(directive.split()[1:])


def _check_page(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    policy = response["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "object-src 'none'" in policy
    allowed = _allowed_scripts(policy)
    assert "'unsafe-inline'" not in allowed and "'unsafe-eval'" not in allowed
    html = response.content.decode()
    for match in INLINE_SCRIPT.finditer(html):
        if "src=" in match["attrs"] or "application/json" in match["attrs"]:
            continue  # a file of the portal's, or data (json_script) that never runs
        digest = base64.b64encode(hashlib.sha256(match["body"].encode()).digest()).decode()
        assert f"'sha256-{digest}'" in allowed, (path, match["body"][:80])
    assert not EVENT_HANDLER.search(html), (path, EVENT_HANDLER.search(html)[0][:120])


def test_every_page_runs_only_the_portals_own_scripts(alice, admin_user):
    job = ended_job(alice, "csp-job")
    attempt = task_attempt(job)
    owner, admin = Client(), Client()
    owner.force_login(alice)
    admin.force_login(admin_user)
    for path in ["/", "/submit/", f"/jobs/{job.pk}/", f"/jobs/{job.pk}/terminal/{attempt.pk}/", "/profile/",
                 "/storage/", "/virtual-clusters/", "/api-help/", f"/submit/?clone={job.pk}"]:
        _check_page(owner, path)
    for path in ["/nodes/", "/dashboard/", "/admin/", "/admin/jobs/node/", "/admin/jobs/job/"]:
        _check_page(admin, path)
    _check_page(Client(), "/login/")


def test_the_api_and_its_errors_carry_it_too_but_not_django_rqs_own_pages(admin_user):
    assert "default-src 'self'" in Client().get("/api/v1/jobs")["Content-Security-Policy"]
    admin = Client()
    admin.force_login(admin_user)
    response = admin.get("/admin/rq/")
    assert response.status_code == 200 and "Content-Security-Policy" not in response
