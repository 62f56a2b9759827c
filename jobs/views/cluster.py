"""Cluster pages: virtual clusters, nodes (admins)."""

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs.models import Node, VirtualCluster


def virtual_clusters(request: HttpRequest) -> HttpResponse:
    return render(request, "jobs/virtual_clusters.html", {"vcs": VirtualCluster.objects.all()})


@staff_member_required
def nodes(request: HttpRequest) -> HttpResponse:
    return render(request, "jobs/nodes.html", {"nodes": Node.objects.all()})
