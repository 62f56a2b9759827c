"""Cluster pages: virtual clusters (everyone), nodes (admins)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from jobs import services
from jobs.models import ACTIVE_TASK_STATES, Node, TaskAttempt, VirtualCluster
from jobs.services import limits
from jobs.services.nodes import engine_identity_conflicts, node_display_state
from jobs.views.nodes import join_panel_context

TASKS_LISTED_PER_NODE = 8


@require_GET
def virtual_clusters(request: HttpRequest) -> HttpResponse:
    allowed = set(VirtualCluster.objects.usable_by(request.user).values_list("name", flat=True))
    return render(request, "jobs/virtual_clusters.html", {"vcs": services.vc_usage(), "allowed": allowed,
                                                          "my_limits": limits.limits_of(user=request.user)})


@require_GET
def nodes(request: HttpRequest) -> HttpResponse:
    # A plain 403 rather than the admin's login page: the user is signed in,
    # the page is simply not theirs.
    if not request.user.is_admin:
        raise PermissionDenied("The nodes page is for administrators.")
    usage = services.node_usage()
    tasks: dict[int, list[TaskAttempt]] = {}
    active = (TaskAttempt.objects.filter(state__in=ACTIVE_TASK_STATES).select_related("task", "job")
              .only("node_id", "state", "task__role", "task__index", "job__name").order_by("id"))
    for attempt in active:
        tasks.setdefault(attempt.node_id, []).append(attempt)
    rows = [(u, tasks.get(u.node.pk, [])[:TASKS_LISTED_PER_NODE], node_display_state(u.node, u.running_tasks))
            for u in usage]
    return render(request, "jobs/nodes.html", {
        "rows": rows, "engine_warnings": engine_identity_conflicts([u.node for u in usage]),
        "join": join_panel_context(request), "drain_modes": Node.DrainMode,
    })
