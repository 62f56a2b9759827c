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
- a job without one, whose image came from a registry (the engine has a
  digest of it) that is not known to let anyone pull it: asked without
  credentials, and the answer kept (finding 34: the records below can be
  lost while the engine keeps its images, and an image may have been pulled
  by an older version or another host's agent);
- anything else (public images asked about once, the local pai-local/...
  images, which have no registry): started as it is, with no round trip.

Before every pull the registry is asked the same way, so that a refusal
reads the same whether or not the node has the image (finding 35): the node
having it says that another user's job pulled it.

Which repositories needed credentials, and which did not, is kept per portal
instance and engine in two files (RepositoryRecord), which the agents of the
engine's host share.

A pull that gets no news from the engine for IMAGE_PULL_STALL_SECONDS is
given up (finding 30): a registry that stops sending mid-download would
otherwise hold the pull, and the launch thread waiting for it, for good. So
is one whose new layers pass IMAGE_PULL_MAX_MB (finding 32): an enormous
image filled the disk the node's other tasks write to; and one still under
way after IMAGE_PULL_MAX_SECONDS (finding 33): a registry that trickles.

A pull's progress (PullRecord) goes to the database for the job page: at
its start, then at most every PROGRESS_INTERVAL seconds (a pull sends
several events per layer per second), and at its end with any error.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, connection

from jobs.images import DOCKER_HUB, reference_key, registry_host, registry_of, registry_refusal
from jobs.models import ExitType
from jobs import services
from jobs.node.launcher import Engine, LaunchError, LaunchStopped, PullProgress, RegistryAuth

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


class RepositoryRecord:
    """Repositories of one kind, one per line: those pulled with credentials
    that their registry refuses without ("private-images"), or those it
    lets anyone pull ("public-images"). Agents append whole short lines
    (atomic with O_APPEND), so two agents of one host can share the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_engine(cls, engine_id: str, kind: str = "private-images") -> RepositoryRecord:
        engine = re.sub(r"[^A-Za-z0-9]+", "-", engine_id) or "engine"
        return cls(settings.VAR_DIR / kind / f"{settings.PAI_INSTANCE}.{engine}")

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


PROGRESS_INTERVAL = 0.5  # seconds between two progress writes of one pull


class PullRecord:
    """One attempt's pull as the job page sees it (jobs/services/pulls.py)."""

    def __init__(self, attempt_id: int, image: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.attempt_id = attempt_id
        self.image = image
        self.clock = clock
        self.latest = PullProgress()
        self._written_at: float | None = None

    def start(self) -> None:
        services.pull_start(attempt_id=self.attempt_id, image=self.image)
        self._written_at = self.clock()

    def progress(self, progress: PullProgress) -> None:
        self.latest = progress
        now = self.clock()
        if self._written_at is None or now - self._written_at >= PROGRESS_INTERVAL:
            services.pull_progress(attempt_id=self.attempt_id, counts=_counts(progress))
            self._written_at = now

    def finish(self, error: str = "") -> None:
        services.pull_finish(attempt_id=self.attempt_id, counts=_counts(self.latest), error=error)


def _counts(progress: PullProgress) -> services.PullCounts:
    return services.PullCounts(layers_done=progress.layers_done, layers_total=progress.layers_total,
                               bytes_done=progress.bytes_done, bytes_total=progress.bytes_total,
                               sizes_pending=progress.sizes_pending)


# A name Docker would also take as the prefix of an image's ID (hex digits
# only) when no image is tagged so: never taken as present on memory alone.
_MAY_BE_AN_ID = re.compile(r"(sha256:)?[0-9a-f]+")
_SEEN_MAX = 1000  # names remembered as present; then forgotten all at once


# How often a launch waiting for a pull looks whether its task was stopped.
STOP_CHECK_SECONDS = 0.2


def _wait_unless_stopped(pull: Callable[[], None], stopped: Callable[[], bool], image: str) -> None:
    """Run `pull` on a thread of its own and wait for it, unless `stopped()`
    says the task was stopped first: a pull can last many minutes (or hang
    on a registry that never answers), and a stopped job stayed STOPPING
    until it ended, and then started the user's command."""
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            close_old_connections()
            pull()
        except BaseException as exc:  # handed to the launch that waits, if it still does
            failure.append(exc)
        finally:
            connection.close()  # this thread's own, opened by the pull's record
            done.set()

    threading.Thread(target=run, name=f"pull-{image[:40]}", daemon=True).start()
    while not done.wait(STOP_CHECK_SECONDS):
        if stopped():
            raise LaunchStopped(f"stopped while image {image} was pulled")
    if failure:
        raise failure[0]


class PullDeferred(Exception):
    """The task's owner has their share of pulls under way on this node: its
    launch waits, off the launch threads, for one of them to end."""


class PullSlots:
    """At most `per_owner` pulls of one user under way on a node at once
    (finding 31). A launch waits for its pull on one of the node's few
    launch threads (runner.LAUNCH_THREADS): without a share, one user's job
    of that many tasks on a slow or trickling registry held every launch of
    the node, every other user's included. A launch over the share is set
    aside, not blocked, and handed back when a pull of its owner ends."""

    def __init__(self, per_owner: int) -> None:
        self.per_owner = per_owner
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}
        self._waiting: dict[int, list[int]] = {}  # owner -> attempts set aside, oldest first

    def take_or_wait(self, owner: int, attempt_id: int) -> bool:
        """A slot for this pull (True), or the attempt set aside (False);
        in one step, so that a pull ending meanwhile cannot miss it."""
        with self._lock:
            if self.per_owner <= 0 or self._held.get(owner, 0) < self.per_owner:
                self._held[owner] = self._held.get(owner, 0) + 1
                return True
            self._waiting.setdefault(owner, []).append(attempt_id)
            return False

    def release(self, owner: int) -> int | None:
        """A pull of `owner` ended: the attempt of theirs to launch again, if any."""
        with self._lock:
            self._held[owner] = max(0, self._held.get(owner, 0) - 1)
            waiting = self._waiting.get(owner)
            if not waiting:
                return None
            attempt_id = waiting.pop(0)
            if not waiting:
                del self._waiting[owner]
            return attempt_id

    def withdraw(self, attempt_id: int) -> bool:
        """Take a set-aside attempt back (its task was stopped); False if it is not waiting."""
        with self._lock:
            for owner, waiting in self._waiting.items():
                if attempt_id in waiting:
                    waiting.remove(attempt_id)
                    if not waiting:
                        del self._waiting[owner]
                    return True
        return False


class ImageGate:
    """Makes sure of a task's image before its launch, by the rules above.

    Names found on the engine are remembered, so the launches that follow
    cost no look-up (an inspect: 3-4 ms of a launch on a busy node,
    bench/submit_to_running.py). The rules above still apply to each
    launch; only the question "is it here?" is answered from memory, and an
    image removed meanwhile is caught when the container is created
    (ImageMissing): the runner then forgets it and asks again."""

    def __init__(self, engine: Engine, private: RepositoryRecord, *, public: RepositoryRecord | None = None,
                 slots: PullSlots | None = None, relaunch: Callable[[int], None] | None = None) -> None:
        self.engine = engine
        self.private = private
        self.public = public  # None: nothing is known public, a registry's image is asked about at each launch
        self.slots = slots or PullSlots(0)
        self._relaunch = relaunch  # hands back an attempt set aside by `slots`
        self._seen: set[str] = set()
        # Present names the engine has no digest of (built or loaded on the
        # node): the launches that follow cost no inspect to learn it again.
        self._local: set[str] = set()

    def forget(self, image: str) -> None:
        self._seen.discard(image)
        self._local.discard(image)

    def _present(self, image: str) -> bool:
        if image in self._seen:
            return True
        if not self.engine.has_image(image):
            return False
        if not _MAY_BE_AN_ID.fullmatch(image):
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            self._seen.add(image)
        return True

    def ensure(self, image: str, auth: RegistryAuth | None, *, allowed: Iterable[str],
               note: Callable[[str], None], attempt_id: int | None = None,
               stopped: Callable[[], bool] | None = None, owner: int | None = None) -> None:
        """`attempt_id`: the task attempt whose launch waits, to show its pull
        on the job page. `stopped`: whether its task was stopped meanwhile;
        then the launch stops waiting for the pull (LaunchStopped). The pull
        goes on: Docker cancels one only when its connection is lost, and
        another task may want the image; its record still ends. `owner`: the
        user whose share of pulls (PullSlots) this one counts in; over it,
        PullDeferred."""
        present = self._present(image)
        recheck = present and (auth is not None or image in self.private or self._unknown(image))
        if present and not recheck:
            return
        refusal = node_registry_refusal(image, allowed=allowed)
        if refusal:
            raise LaunchError(ExitType.IMAGE_PULL, f"could not pull image {image}: {refusal}")
        if recheck:
            self._check_present(image, auth, note=note, attempt_id=attempt_id)
            if auth is None:
                self._record_public(image)  # asked without credentials, and let through
            return
        private = auth is not None and not self._anyone_may_pull(image)
        if private:
            # Recorded before the pull, not after it: from the pull's end the
            # image is on the engine, and another job's launch meanwhile (a
            # thread of this agent, or another agent of the engine) must find
            # it private; so must the next agent, if this one dies mid-pull.
            self.private.add(image)
        shared = owner is not None and attempt_id is not None
        if shared and not self.slots.take_or_wait(owner, attempt_id):
            raise PullDeferred()
        note(f"pulling image {image}")
        record = PullRecord(attempt_id, image) if attempt_id is not None else None

        def pull() -> None:
            try:
                self._pull(image, auth, record)
            finally:  # the pull itself ended, not the launch's wait for it
                if shared:
                    self._slot_freed(owner)

        if stopped is None:
            pull()
        else:
            _wait_unless_stopped(pull, stopped, image)
        if not private:
            self._record_public(image)  # pulled without credentials, or with some it did not need
        note(f"pulled image {image}")

    def _slot_freed(self, owner: int) -> None:
        waiting = self.slots.release(owner)
        if waiting is not None and self._relaunch is not None:
            self._relaunch(waiting)

    def _pull(self, image: str, auth: RegistryAuth | None, record: PullRecord | None) -> None:
        limits = {"stall_seconds": settings.IMAGE_PULL_STALL_SECONDS or None,
                  "max_mb": settings.IMAGE_PULL_MAX_MB or None, "max_seconds": settings.IMAGE_PULL_MAX_SECONDS or None}
        # Asked first, as for an image the node has (_check_present): the
        # registry's refusal reads the same either way.
        if record is None:
            self._check(image, auth)
            self.engine.ensure_image(image, auth, **limits)
            return
        record.start()
        try:
            self._check(image, auth)
            self.engine.ensure_image(image, auth, progress=record.progress, **limits)
        except LaunchError as exc:
            record.finish(exc.message)
            raise
        except Exception as exc:  # our own failure: the page still must not show it pulling
            record.finish(f"could not pull image {image}: {exc.__class__.__name__}")
            raise
        record.finish()

    def _check_present(self, image: str, auth: RegistryAuth | None, *, note: Callable[[str], None],
                       attempt_id: int | None) -> None:
        """Ask the registry about an image the node has. A refusal is told
        as a pull's would be, note, pull record and message alike (finding
        35): whether the node has an image is other users' business (their
        jobs pulled it), never this job's."""
        try:
            self._check(image, auth)
        except LaunchError as exc:
            note(f"pulling image {image}")
            if attempt_id is not None:
                record = PullRecord(attempt_id, image)
                record.start()
                record.finish(exc.message)
            raise

    def _check(self, image: str, auth: RegistryAuth | None) -> None:
        try:
            self.engine.check_image_access(image, auth)
        except LaunchError as exc:
            given = "with this job's credentials" if auth else "without credentials: the job gives none"
            raise LaunchError(ExitType.IMAGE_PULL, (
                f"could not pull image {image}: {exc.message} (the registry {registry_of(image)} was asked "
                f"{given}; a job may use a private image only with credentials that can pull it)")) from None

    def _unknown(self, image: str) -> bool:
        """An image from a registry that no record says anything of."""
        if image in self._local or (self.public is not None and image in self.public):
            return False
        if self.engine.has_registry_digest(image):
            return True
        if len(self._local) < _SEEN_MAX:
            self._local.add(image)
        return False

    def _record_public(self, image: str) -> None:
        if self.public is not None and image not in self.private:
            self.public.add(image)

    def _anyone_may_pull(self, image: str) -> bool:
        try:
            self.engine.check_image_access(image, None)
        except LaunchError:
            return False  # refused, or could not ask: treat it as private
        return True
