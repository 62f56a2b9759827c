"""Template tags of the interactive-access partials, so the pages that
include them (job detail, profile) pass nothing beyond the job and attempt."""

from __future__ import annotations

from django import template

from jobs.models import Job, TaskAttempt
from jobs.services import access
from jobs.views.access import ssh_keys_panel_context

register = template.Library()


@register.simple_tag(takes_context=True)
def task_access(context: template.Context, job: Job, attempt: TaskAttempt) -> access.TaskAccess | None:
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return None
    return access.task_access(job=job, attempt=attempt, user=request.user)


@register.simple_tag(takes_context=True)
def ssh_keys_panel(context: template.Context) -> dict:
    return ssh_keys_panel_context(context["request"])
