"""The OpenAPI description of the v2 node paths (jobs/api/views/nodes.py),
merged into /api/v2/openapi.json by openapi_v2.py."""

from __future__ import annotations

from jobs.api.openapi import INTEGER, STRING, Schema, answer, body, errors, obj, operation, path_param

NODE = obj({
    "name": STRING, "address": STRING, "status": {"type": "string", "enum": ["READY", "LOST"]},
    "state": {"type": "string", "enum": ["READY", "CORDONED", "DRAINING", "DRAINED"]},
    "schedulable": {"type": "boolean"}, "drainMode": {"type": "string", "enum": ["stop", "wait"], "nullable": True},
    "activeTasks": INTEGER, "heartbeatFresh": {"type": "boolean"}, "engineId": STRING, "engineMarker": STRING,
}, ["name", "state", "status"], additionalProperties=True)
TOKEN = obj({"prefix": STRING, "label": STRING, "valid": {"type": "boolean"}, "expiresAt": STRING,
             "uses": INTEGER}, ["prefix", "valid", "expiresAt"], additionalProperties=True)
NAME = [path_param("name", "the node's name")]
JOIN_ERROR = {"description": "The join token is missing, unknown, expired or revoked (InvalidJoinTokenError, "
                             "with `reason`: missing, unknown, expired or revoked).",
              "content": {"application/json": {"schema": obj({"code": STRING, "message": STRING, "reason": STRING},
                                                             ["code", "message", "reason"])}}}


def _action(summary: str, description: str, request: Schema | None = None) -> Schema:
    return {"parameters": NAME, "post": operation(
        summary, {**answer(200, "The node as it is now.", NODE), **errors(400, 401, 403, 404)},
        request_body=request, description=description, tag="nodes")}


def paths() -> dict[str, Schema]:
    return {
        "/nodes": {"get": operation("List nodes", {**answer(200, "Every node, and warnings about engine identities.",
                                                            obj({"nodes": {"type": "array", "items": NODE},
                                                                 "warnings": {"type": "array", "items": STRING}})),
                                                   **errors(401, 403)}, tag="nodes", description="Admins only.")},
        "/nodes/join": {"post": operation(
            "Join a node", {**answer(200, "The node's settings, as environment variables.",
                                     obj({"settings": {"type": "object", "additionalProperties": STRING},
                                          "warnings": {"type": "array", "items": STRING},
                                          "tokenExpiresAt": STRING})),
                            "401": JOIN_ERROR, **errors(429)}, public=True, tag="nodes",
            description="Send `Authorization: Bearer <join token>` (not an API token). scripts/join-node calls it. "
                        "Refused tokens count toward the failed-login limit of the client's address.")},
        "/nodes/{name}": {"parameters": NAME, "get": operation(
            "Get a node", {**answer(200, "The node.", NODE), **errors(401, 403, 404)}, tag="nodes",
            description="Admins only. A node named `join` is seen in the list (its actions work as usual).")},
        "/nodes/{name}/cordon": _action("Cordon a node", "Admins only: no new task is placed on the node."),
        "/nodes/{name}/drain": _action(
            "Drain a node", "Admins only: cordon, then `mode` stop (its tasks end FAILED with \"node drained\"; "
                            "counts toward retryCount like a node loss) or wait (its tasks run to their end).",
            body(obj({"mode": {"type": "string", "enum": ["stop", "wait"]}}, ["mode"]))),
        "/nodes/{name}/uncordon": _action("Uncordon a node", "Admins only: back in service; ends a drain."),
        "/node-join-tokens": {
            "get": operation("List join tokens", {**answer(200, "Every join token (never the secret).",
                                                           {"type": "array", "items": TOKEN}), **errors(401, 403)},
                             tag="nodes", description="Admins only."),
            "post": operation("Make a join token", {
                **answer(201, "The token (`token`, shown once) and its record.", TOKEN), **errors(400, 401, 403)},
                request_body=body(obj({"ttl": {"type": "integer", "minimum": 60}, "label": STRING}), required=False),
                tag="nodes", description="Admins only. `ttl` in seconds (default one day, at most 30 days)."),
        },
        "/node-join-tokens/{prefix}": {"parameters": [path_param("prefix", "the token's shown prefix (pjt_...)")],
                                       "delete": operation("Revoke a join token", {
                                           **answer(200, "The token, revoked.", TOKEN), **errors(400, 401, 403, 404)},
                                           tag="nodes", description="Admins only.")},
    }
