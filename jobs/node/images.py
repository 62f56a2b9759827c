"""A task's image on a node: where the engine may be sent for it, and who
may start an image the node already has.

Registry addresses (finding 15, node side): before the engine is sent to a
registry (a pull, or a check below), the registry's host name is resolved
here and the launch refused if it points at the node itself, a link-local
address (cloud metadata) or, unless REGISTRY_ALLOWED opens it, a private
address. Submission checked the name as written (jobs/services/admission.py);
only the node can check what it resolves to. Docker resolves the name again
when it connects: a name that changes its answer in between is not caught.
Docker Hub is not resolved: it is Docker's fixed default.

Private images (finding 6): an image pulled with one job's credentials stays
on the node, where the engine would start it for anyone. A job may use an
image that needs credentials only if its own credentials can pull it (as with
Kubernetes' AlwaysPullImages), without that cost for public images:

- a job with an authFile whose image is on the node: its registry is asked
  at each launch, with those credentials (a manifest inspect, no download);
- a job without one, whose image's repository was pulled with credentials
  on this engine and is refused without them: asked without credentials at
  each launch, which refuses it;
- anything else (Docker Hub and other public images, the local pai-local/...
  images, which have no registry): started as it is, with no round trip.

Which repositories needed credentials is kept per portal instance and engine
in a file (PrivateImages), which the agents of the engine's host share.
Images pulled with credentials by a version before this one are not in it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

from django.conf import settings

from jobs.images import DOCKER_HUB, reference_key, registry_host, registry_of, registry_refusal
from jobs.models import ExitType
from jobs.node.launcher import Engine, LaunchError, RegistryAuth

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


class PrivateImages:
    """Repositories pulled with credentials that their registry refuses
    without, one per line. Agents append whole short lines (atomic with
    O_APPEND), so two agents of one host can share the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_engine(cls, engine_id: str) -> PrivateImages:
        engine = re.sub(r"[^A-Za-z0-9]+", "-", engine_id) or "engine"
        return cls(settings.VAR_DIR / "private-images" / f"{settings.PAI_INSTANCE}.{engine}")

    def __contains__(self, image: str) -> bool:
        try:
            known = self.path.read_text().splitlines()
        except FileNotFoundError:
            return False
        return reference_key(image)[0] in known

    def add(self, image: str) -> None:
        if image in self:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as record:
            record.write(reference_key(image)[0] + "\n")


class ImageGate:
    """Makes sure of a task's image before its launch, by the rules above."""

    def __init__(self, engine: Engine, private: PrivateImages) -> None:
        self.engine = engine
        self.private = private

    def ensure(self, image: str, auth: RegistryAuth | None, *, allowed: Iterable[str],
               note: Callable[[str], None]) -> None:
        present = self.engine.has_image(image)
        recheck = present and (auth is not None or image in self.private)
        if present and not recheck:
            return
        refusal = node_registry_refusal(image, allowed=allowed)
        if refusal:
            raise LaunchError(ExitType.IMAGE_PULL, f"could not pull image {image}: {refusal}")
        if recheck:
            self._check(image, auth)
            return
        note(f"pulling image {image}")
        self.engine.ensure_image(image, auth)
        note(f"pulled image {image}")
        if auth is not None and not self._anyone_may_pull(image):
            self.private.add(image)

    def _check(self, image: str, auth: RegistryAuth | None) -> None:
        try:
            self.engine.check_image_access(image, auth)
        except LaunchError as exc:
            given = "with this job's authFile" if auth else "without credentials (the job has no authFile)"
            raise LaunchError(ExitType.IMAGE_PULL, (
                f"the registry {registry_of(image)} refused image {image} {given}: {exc.message}. This node has "
                "the image from a pull with other credentials; a job may use it only with credentials that can "
                "pull it.")) from None

    def _anyone_may_pull(self, image: str) -> bool:
        try:
            self.engine.check_image_access(image, None)
        except LaunchError:
            return False  # refused, or could not ask: treat it as private
        return True
