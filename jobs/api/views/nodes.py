"""Nodes through the REST API (v2): list them, cordon, drain and uncordon
them, manage join tokens (admins only), and the join itself, where a new
node machine trades a join token for its settings (scripts/join-node).
"""

from __future__ import annotations

from django.db.models import Count
from datetime import datetime
from django.http import HttpRequest, HttpResponse

from jobs.api.auth import Access
from jobs.api.errors import ApiError, invalid
from jobs.api.http import handler, int_param, json_body, ok, resource, string_param
from jobs.models import ACTIVE_TASK_STATES, Node, NodeJoinToken, TaskAttempt
from jobs.services import join_tokens, nodes, ratelimit
from jobs.services.node_settings import node_settings, node_settings_warnings
from jobs.services.db_clock import database_now

# Failed joins count under this kind, per client address only: guessing
# tokens from one address is held up like guessing passwords, and no one's
# failures hold up a node joining from another address (ratelimit.py).
JOIN_LIMIT_NAME = "node-join"


def _node_json(node: Node, active: int, now: datetime) -> dict:
    return {
        "name": node.name, "address": node.address, "status": node.status,
        "state": nodes.node_display_state(node, active), "schedulable": node.schedulable,
        "drainMode": node.drain_mode or None, "cordonedBy": node.cordoned_by or None,
        "cordonedAt": node.cordoned_at.isoformat() if node.cordoned_at else None,
        "activeTasks": active, "heartbeatFresh": node.heartbeat_fresh(now),
        "lastHeartbeat": node.last_heartbeat.isoformat() if node.last_heartbeat else None,
        "cpus": node.cpus, "memoryMB": node.memory_mb, "gpus": node.gpus, "gpusSimulated": node.gpus_simulated,
        "engineId": node.engine_id, "engineMarker": node.engine_marker,
    }


def _active_counts() -> dict[int, int]:
    rows = TaskAttempt.objects.filter(state__in=ACTIVE_TASK_STATES).values("node_id").annotate(n=Count("id"))
    return {row["node_id"]: row["n"] for row in rows}


def _node(name: str) -> Node:
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise ApiError("NoNodeError", f"Node {name} is not found.", status=404)
    return node


def _one(node: Node) -> HttpResponse:
    active = TaskAttempt.objects.filter(node=node, state__in=ACTIVE_TASK_STATES).count()
    return ok(_node_json(node, active, database_now()))


@handler(Access.ADMIN)
def _list(request: HttpRequest) -> HttpResponse:
    counts, now = _active_counts(), database_now()
    return ok({"nodes": [_node_json(n, counts.get(n.pk, 0), now) for n in Node.objects.all()],
               "warnings": nodes.engine_identity_conflicts()})


@handler(Access.ADMIN)
def _show(request: HttpRequest, name: str) -> HttpResponse:
    return _one(_node(name))


@handler(Access.ADMIN)
def _cordon(request: HttpRequest, name: str) -> HttpResponse:
    return _one(nodes.node_cordon(node=_node(name), by=request.user))


@handler(Access.ADMIN)
def _drain(request: HttpRequest, name: str) -> HttpResponse:
    params = json_body(request)
    mode = string_param(params, "mode", max_length=8)
    if mode not in (Node.DrainMode.STOP, Node.DrainMode.WAIT):
        raise invalid(f"mode must be 'stop' (stop the node's tasks; their jobs retry elsewhere) or 'wait' (let them "
                      f"finish), got {mode!r}.")
    return _one(nodes.node_drain(node=_node(name), by=request.user, mode=mode))


@handler(Access.ADMIN)
def _uncordon(request: HttpRequest, name: str) -> HttpResponse:
    return _one(nodes.node_uncordon(node=_node(name)))


# ------------------------------------------------------------- join tokens


def _token_json(token: NodeJoinToken) -> dict:
    return {
        "prefix": token.prefix, "label": token.label, "valid": token.is_valid,
        "createdBy": token.created_by.username if token.created_by else None,
        "createdAt": token.created_at.isoformat(), "expiresAt": token.expires_at.isoformat(),
        "revokedAt": token.revoked_at.isoformat() if token.revoked_at else None,
        "lastUsedAt": token.last_used_at.isoformat() if token.last_used_at else None,
        "lastUsedFrom": token.last_used_from or None, "uses": token.uses,
    }


@handler(Access.ADMIN)
def _tokens(request: HttpRequest) -> HttpResponse:
    return ok([_token_json(t) for t in NodeJoinToken.objects.select_related("created_by")])


@handler(Access.ADMIN)
def _token_create(request: HttpRequest) -> HttpResponse:
    params = json_body(request)
    seconds = int_param(params, "ttl", default=join_tokens.DEFAULT_SECONDS, minimum=join_tokens.MIN_SECONDS,
                        maximum=join_tokens.MAX_SECONDS)
    label = string_param(params, "label", required=False, max_length=100) or ""
    made = join_tokens.join_token_create(by=request.user, seconds=seconds, label=label)
    return ok({"token": made.key, **_token_json(made.token)}, status=201)


@handler(Access.ADMIN)
def _token_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    found = join_tokens.join_tokens_matching(prefix)
    if not found:
        raise ApiError("NoJoinTokenError", f"No join token starts with {prefix}.", status=404)
    if len(found) > 1:
        raise invalid(f"{len(found)} join tokens start with {prefix}: give more of it.")
    join_tokens.join_token_revoke(token=found[0])
    found[0].refresh_from_db()
    return ok(_token_json(found[0]))


# ------------------------------------------------------------------ joining


def _join_key(request: HttpRequest) -> str:
    header = request.META.get("HTTP_AUTHORIZATION", "").strip()
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


@handler(Access.PUBLIC)  # the join token is the credential, checked here
def _join(request: HttpRequest) -> HttpResponse:
    address = ratelimit.client_address(request)
    wait = ratelimit.address_wait_seconds(kind=JOIN_LIMIT_NAME, address=address)
    if wait:
        raise ApiError("TooManyRequestsError", f"Too many refused join tokens from {address}; try again in {wait} "
                                               "seconds.", headers={"Retry-After": str(wait)})
    try:
        token = join_tokens.join_token_use(_join_key(request), client=address)
    except join_tokens.JoinTokenError as exc:
        ratelimit.address_failed(kind=JOIN_LIMIT_NAME, address=address)
        raise ApiError("InvalidJoinTokenError", f"Join refused: {exc.message}", status=401,
                       headers={"WWW-Authenticate": 'Bearer realm="node-join"'}, extra={"reason": exc.reason}) from None
    ratelimit.address_reset(kind=JOIN_LIMIT_NAME, address=address)
    values = node_settings()
    return ok({"settings": values, "warnings": node_settings_warnings(values),
               "tokenExpiresAt": token.expires_at.isoformat()}, headers={"Cache-Control": "no-store"})


nodes_list = resource(GET=_list)
node = resource(GET=_show)
node_cordon = resource(POST=_cordon)
node_drain = resource(POST=_drain)
node_uncordon = resource(POST=_uncordon)
node_join = resource(POST=_join)
join_token_list = resource(GET=_tokens, POST=_token_create)
join_token = resource(DELETE=_token_revoke)
