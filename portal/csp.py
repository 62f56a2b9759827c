"""A Content-Security-Policy on the portal's own pages: a second line of
defence behind template escaping. Should a job name, log line or file name
ever reach a page unescaped, the browser still runs no script the portal
did not serve itself.

Scripts: only the portal's files, plus the one inline script below by its
hash (the Submit page marks itself as scripted before it paints, so the
no-script form never flashes). Styles may be inline: usage bars set their
widths in style attributes and the terminal (xterm) writes its theme into a
<style> element; neither can run code. Task web ports are served on their
own origins by the proxy (jobs/webports/), outside Django, so this policy
never reaches a user's Jupyter.

django-rq's queue pages (admins only) carry inline scripts and onclick
handlers of their own, so they get no policy rather than a broken one.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

# The Submit page's inline script, byte for byte (templates/jobs/submit.html);
# tests/test_content_security_policy.py checks every inline script of every
# page against the policy, so a change to it cannot go unnoticed.
SUBMIT_PAGE_SCRIPT = 'document.getElementById("submit-page").classList.add("js");'
EXEMPT_PREFIXES = ("/admin/rq/",)


def _script_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


POLICY = "; ".join([
    "default-src 'self'",
    f"script-src 'self' {_script_hash(SUBMIT_PAGE_SCRIPT)}",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "connect-src 'self'",  # fetches and the terminal's WebSocket, same origin
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
])


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith(EXEMPT_PREFIXES):
            response.setdefault("Content-Security-Policy", POLICY)
        return response
