"""The profile page's API-token panel gets its data here, so the profile view
itself passes nothing (see jobs/views/tokens.py)."""

from __future__ import annotations

from django import template

from jobs.views.tokens import tokens_panel_context

register = template.Library()


@register.simple_tag(takes_context=True)
def api_tokens_panel(context: template.Context) -> dict:
    return tokens_panel_context(context["request"])
