"""The user's own page: SSH public keys, API tokens; the API help page."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def profile(request: HttpRequest) -> HttpResponse:
    return render(request, "jobs/profile.html", {})


def api_help(request: HttpRequest) -> HttpResponse:
    return render(request, "jobs/api_help.html", {})
