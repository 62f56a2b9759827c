"""Where the engine may be sent for an image: the registry's host as it
resolves on the node (finding 15; see the package's notes).

A registry name that does not resolve reads the same whoever resolves it
(the node here, the engine for Docker Hub, which the node does not resolve):
a DNS that answers that the name does not exist fails the launch at once,
naming the registry (a typo in the image's name, most likely: a retry would
get the same answer); a DNS that gives no answer (none on the node, or one
that is down or times out) is waited for as a registry that cannot be
reached (finding 46), since it may come back."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

from jobs.images import DOCKER_HUB, registry_host, registry_of, registry_refusal
from jobs.node.launcher import RegistryUnreachable

Resolve = Callable[[str], list[str]]

# getaddrinfo's answers that the name does not exist (NXDOMAIN) or has no
# address; any other failure is the resolver's (EAI_AGAIN: no answer).
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def no_such_registry(registry: str, detail: str) -> str:
    """Why a launch fails whose registry name the DNS says does not exist."""
    # Docker Hub's name is the engine's, never the user's: only the node's DNS can be wrong.
    hint = ("the node's DNS is wrong: tell its admin" if registry == DOCKER_HUB else
            "check the registry in the image's name")
    return f"the registry {registry} does not resolve on the node: its DNS says there is no such name ({detail}); {hint}"


def resolve_host(host: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})


def node_registry_refusal(image: str, *, allowed: Iterable[str], resolve: Resolve = resolve_host) -> str | None:
    """Why the engine must not be sent to the registry of `image`, or None.
    RegistryUnreachable if the node's DNS gave no answer about its name."""
    registry = registry_of(image)
    if registry == DOCKER_HUB:
        return None
    host = registry_host(registry)
    if _is_address(host):
        return registry_refusal(registry, allowed=allowed)
    try:
        addresses = resolve(host)
    except OSError as exc:
        if isinstance(exc, socket.gaierror) and exc.errno in _NO_SUCH_NAME:
            return no_such_registry(registry, str(exc))
        raise RegistryUnreachable(f'the registry host "{host}" could not be resolved now ({exc})') from None
    return registry_refusal(registry, resolved=addresses, allowed=allowed)


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True
