"""GET /api/v1 and the API's OpenAPI description."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from jobs.api import openapi
from jobs.api.auth import Access
from jobs.api.http import handler, ok, resource


@handler(Access.PUBLIC)
def _info(request: HttpRequest) -> HttpResponse:
    # launcherType "yarn" is what OpenPAI clients expect of a server that
    # speaks the v1 API (they switch to v2 paths for "k8s").
    return ok({"name": "GPU Job Portal REST API", "version": "v1.0.0", "launcherType": "yarn", "authnMethod": "basic"})


@handler(Access.PUBLIC)
def _description(request: HttpRequest) -> HttpResponse:
    prefix = request.path.rsplit("/", 1)[0]
    return ok(openapi.description(server_url=prefix))


info = resource(GET=_info)
description = resource(GET=_description)
