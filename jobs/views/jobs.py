from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs.models import Job


def job_list(request: HttpRequest) -> HttpResponse:
    jobs = Job.objects.visible_to(request.user).select_related("owner", "virtual_cluster")[:50]
    return render(request, "jobs/list.html", {"jobs": jobs})
