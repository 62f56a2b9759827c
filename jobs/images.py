"""Image references: which registry an image name points at, and whether a
node's Docker engine may be sent there. Pure: no Django, no I/O.

An image name like `127.0.0.1:6379/x` makes the node's engine open a
connection to port 6379 of the node itself (Redis, the portal, anything on
loopback), so registry hosts on loopback, link-local and, unless an admin
allows them, private addresses are refused. Names that are not literal
addresses are checked again on the node, on the address they resolve to,
right before a pull (jobs/node/runner.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from jobs.addresses import is_public

# Docker's rule (distribution/reference's splitDockerDomain): the first path
# component names a registry when it holds a "." or a ":", is "localhost",
# or has an upper-case letter (repository names are lower case, so
# "LOCALHOST/x" or "Redis/x" is a host); otherwise the image is on Docker Hub.
DOCKER_HUB = "docker.io"


def registry_of(image: str) -> str:
    """The registry host (with its port, if any) an image reference names."""
    first, sep, _rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        return first
    return DOCKER_HUB


def reference_key(image: str) -> tuple[str, str]:
    """(repository, tag or digest) of an image name in Docker's full form,
    so that `busybox`, `busybox:latest` and `docker.io/library/busybox` are
    one image: ("docker.io/library/busybox", "latest")."""
    name, at, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = "latest"
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    registry = registry_of(name)
    path = name.partition("/")[2] if name.startswith(registry + "/") else name
    if registry in (DOCKER_HUB, "index.docker.io"):
        registry = DOCKER_HUB
        path = path if "/" in path else f"library/{path}"
    return f"{registry}/{path}", digest if at else tag


def registry_host(registry: str) -> str:
    """The host part of a registry (`[::1]:5000` -> `::1`), lower case."""
    return _host(registry).lower().rstrip(".")


def _host(registry: str) -> str:
    if registry.startswith("["):  # [::1]:5000
        return registry[1:].partition("]")[0]
    host, _sep, port = registry.rpartition(":")
    return host if _sep and port.isdigit() else registry


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def registry_refusal(registry: str, *, resolved: Iterable[str] = (), allowed: Iterable[str] = ()) -> str | None:
    """Why the node must not contact `registry`, or None.

    `resolved` are the addresses its name resolves to, when known (the node
    checks them before a pull). `allowed` (REGISTRY_ALLOWED) are entries an
    admin opened: a registry as written (`10.0.0.5:5000`), a host name, or
    a CIDR, for a registry on the cluster's own network (or, in a test
    set-up, on loopback)."""
    host = _host(registry).lower().rstrip(".")
    literal = _address(host)
    addresses = [a for a in ([literal] if literal else [_address(t) for t in resolved]) if a is not None]
    if _opened(registry.lower(), host, addresses, [e.strip().lower() for e in allowed if e.strip()]):
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return f'the registry "{registry}" is the node itself (localhost); use a registry on another host'
    for address in addresses:
        if address.is_loopback or address.is_unspecified:
            return f'the registry "{registry}" is on a loopback address ({address}): the node itself'
        if address.is_link_local:
            return f'the registry "{registry}" is on a link-local address ({address}), such as a cloud metadata service'
        if address.is_private:
            return (f'the registry "{registry}" is on a private address ({address}); an admin can allow it '
                    "with REGISTRY_ALLOWED")
        if not is_public(address):  # shared 100.64/10 (a cloud's metadata), reserved, NAT64 of a private one ...
            return (f'the registry "{registry}" is on an address that is not public ({address}); an admin can '
                    "allow it with REGISTRY_ALLOWED")
    return None


def _opened(registry: str, host: str, addresses: list, allowed: list[str]) -> bool:
    for entry in allowed:
        if entry in (registry, host):
            return True
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue
        if addresses and all(address in network for address in addresses):
            return True
    return False
