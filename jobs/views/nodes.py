"""The Nodes page's admin actions: cordon, drain, uncordon a node; make and
revoke join tokens. POST only (with Django's CSRF check), admins only; each
goes back to the Nodes page with a message."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.models import Node, NodeJoinToken
from jobs.services import join_tokens, nodes

# The new join token travels to the Nodes page once, through the session.
NEW_JOIN_TOKEN = "node_join_token_new"
TTL_CHOICES = [(3600, "1 hour"), (24 * 3600, "1 day"), (7 * 24 * 3600, "7 days"), (30 * 24 * 3600, "30 days")]


class JoinTokenForm(forms.Form):
    label = forms.CharField(max_length=100, required=False)
    ttl = forms.TypedChoiceField(choices=TTL_CHOICES, coerce=int, initial=24 * 3600, label="Expires after")


def admin_post(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """POST only, admins only (a plain 403 for other users, as the page)."""

    @require_POST
    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_admin:
            raise PermissionDenied("Nodes are managed by administrators.")
        return view(request, *args, **kwargs)

    return wrapped


def _back(anchor: str = "") -> HttpResponse:
    return redirect(reverse("jobs:nodes") + anchor)


@admin_post
def cordon(request: HttpRequest, node_id: int) -> HttpResponse:
    node = nodes.node_cordon(node=get_object_or_404(Node, pk=node_id), by=request.user)
    messages.success(request, f"Cordoned {node.name}: no new task is placed there; its tasks go on.")
    return _back()


@admin_post
def drain(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node, pk=node_id)
    mode = request.POST.get("mode", "")
    if mode not in (Node.DrainMode.STOP, Node.DrainMode.WAIT):
        messages.error(request, f"Not drained: mode must be 'stop' or 'wait', not {mode!r}.")
        return _back()
    nodes.node_drain(node=node, by=request.user, mode=mode)
    if mode == Node.DrainMode.STOP:
        messages.success(request, f"Draining {node.name}: its tasks are being stopped; their jobs retry elsewhere "
                                  "if they have retries left.")
    else:
        messages.success(request, f"Draining {node.name}: no new task goes there; its tasks run to their end.")
    return _back()


@admin_post
def uncordon(request: HttpRequest, node_id: int) -> HttpResponse:
    node = nodes.node_uncordon(node=get_object_or_404(Node, pk=node_id))
    messages.success(request, f"{node.name} is back in service.")
    return _back()


@admin_post
def join_token_create(request: HttpRequest) -> HttpResponse:
    form = JoinTokenForm(request.POST)
    if not form.is_valid():
        messages.error(request, "No join token was made: " + "; ".join(
            f"{field}: {' '.join(errors)}" for field, errors in form.errors.items()))
        return _back("#join-tokens")
    made = join_tokens.join_token_create(by=request.user, seconds=form.cleaned_data["ttl"],
                                         label=form.cleaned_data["label"].strip())
    request.session[NEW_JOIN_TOKEN] = {"id": made.token.pk, "key": made.key}
    messages.success(request, "Made a join token. Copy it now: it is shown only once.")
    return _back("#join-tokens")


@admin_post
def join_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(NodeJoinToken, pk=token_id)
    if join_tokens.join_token_revoke(token=token):
        messages.success(request, f"Revoked the join token {token.prefix}…; nodes that joined with it keep running.")
    return _back("#join-tokens")


def join_panel_context(request: HttpRequest) -> dict:
    """What the page's join token panel shows; takes a new token out of the
    session (it is shown once)."""
    new = request.session.pop(NEW_JOIN_TOKEN, None)
    portal_url = request.build_absolute_uri("/").rstrip("/")
    return {"tokens": list(NodeJoinToken.objects.select_related("created_by")[:100]), "new_token": new,
            "form": JoinTokenForm(), "portal_url": portal_url}
