"""The storage page: browse, upload, download (see jobs/storage/)."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def browse(request: HttpRequest) -> HttpResponse:
    return render(request, "jobs/storage.html", {})
