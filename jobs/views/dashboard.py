"""The admin dashboard: the cluster over time (GPUs in use by virtual
cluster and user, jobs waiting and running, CPU and memory from the usage
samples) and the tasks flagged for idle GPUs. Admins only: a plain 403 for
other users, as the Nodes page."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from jobs import services
from jobs.ids import parse_id
from jobs.services import dashboard as figures


def _hours(request: HttpRequest) -> int:
    raw = request.GET.get("hours", "")
    hours = parse_id(raw)
    return hours if hours in figures.WINDOWS else 24


@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    if not request.user.is_admin:
        raise PermissionDenied("The dashboard is for administrators.")
    hours = _hours(request)
    vcs = services.vc_usage()
    shares = {vc.name: sum(int(amount.total) for amount in vc.gpus.values()) for vc in vcs}
    return render(request, "jobs/dashboard.html", {
        "hours": hours, "windows": list(figures.WINDOWS),
        "series": figures.dashboard_figures(hours=hours, vc_gpus=shares),
        "vcs": vcs, "idle_tasks": figures.idle_gpu_tasks(),
        "idle_percent": f"{settings.IDLE_GPU_PERCENT:g}%", "idle_minutes": f"{settings.IDLE_GPU_MINUTES:g}",
    })
