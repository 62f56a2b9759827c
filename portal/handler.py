"""Django's WSGI handler, with the one request it could not even build
answered like any other bad request.

Django parses the Content-Type header while it builds the request, before
any middleware runs: an RFC 2231 parameter naming a charset Python does not
know (`multipart/form-data; boundary*=zzz''x`) raised ValueError there, a
500 at any URL. Such a request is taken as one without a Content-Type, so
each view refuses its body as it refuses any body not of its type.
"""

from __future__ import annotations

from typing import Any

import django
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest


class PortalWSGIRequest(WSGIRequest):
    def _set_content_type_params(self, meta: dict[str, Any]) -> None:
        try:
            super()._set_content_type_params(meta)
        except ValueError:
            self.content_type, self.content_params = "", {}


class PortalWSGIHandler(WSGIHandler):
    request_class = PortalWSGIRequest


def get_wsgi_application() -> PortalWSGIHandler:
    """As django.core.wsgi.get_wsgi_application, with the request above."""
    django.setup(set_prefix=False)
    return PortalWSGIHandler()
