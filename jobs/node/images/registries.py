"""Where the engine may be sent for an image: the registry's host as it
resolves on the node (finding 15; see the package's notes)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

from jobs.images import DOCKER_HUB, registry_host, registry_of, registry_refusal

Resolve = Callable[[str], list[str]]


def resolve_host(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})


def node_registry_refusal(image: str, *, allowed: Iterable[str], resolve: Resolve = resolve_host) -> str | None:
    """Why the engine must not be sent to the registry of `image`, or None."""
    registry = registry_of(image)
    if registry == DOCKER_HUB:
        return None
    host = registry_host(registry)
    if _is_address(host):
        return registry_refusal(registry, allowed=allowed)
    try:
        addresses = resolve(host)
    except OSError as exc:
        return f'the registry host "{host}" could not be resolved ({exc})'
    return registry_refusal(registry, resolved=addresses, allowed=allowed)


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True
