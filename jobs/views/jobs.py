"""Job pages: list, submit, detail."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from jobs.models import Job


def job_list(request: HttpRequest) -> HttpResponse:
    jobs = Job.objects.visible_to(request.user).select_related("owner", "virtual_cluster")[:50]
    return render(request, "jobs/list.html", {"jobs": jobs})


def submit(request: HttpRequest) -> HttpResponse:
    return render(request, "jobs/submit.html", {})


def detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.visible_to(request.user), pk=job_id)
    return render(request, "jobs/detail.html", {"job": job})
