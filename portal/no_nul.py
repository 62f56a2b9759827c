"""Requests whose path or query string holds a NUL character are refused
with a 400 before any view runs.

No name or value in the portal may hold one, and PostgreSQL cannot even
compare a string holding one: a lookup of `/api/v1/user/a%00/jobs/x` there
raises instead of finding nothing. Request bodies are checked where they are
read (forms by Django's form fields, the API's JSON and forms by
jobs.api.http.json_body, job configs by their readers).
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from django.views.defaults import bad_request

from jobs.api.errors import error_response

API_PREFIXES = ("/api/", "/rest-server/")
MESSAGE = "The request's path or query string holds a NUL character (%00), which no name or value here may hold."


class RefuseNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        query = request.META.get("QUERY_STRING", "")
        if "\x00" in request.path or "%00" in query or "\x00" in query:
            if request.path.startswith(API_PREFIXES):
                return error_response("InvalidParametersError", MESSAGE)
            return bad_request(request, SuspiciousOperation(MESSAGE))
        return self.get_response(request)
