"""Making sure of a task's image before its launch, by the rules in the
package's notes: ImageGate, and how a launch waits for a check or pull off
the node's launch threads."""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from django.conf import settings
from django.db import close_old_connections, connection

from jobs import services
from jobs.images import registry_of
from jobs.models import ExitType
from jobs.node.images.records import PullRecord, RepositoryRecord
from jobs.node.images.registries import no_such_registry, node_registry_refusal
from jobs.node.images.slots import PullSlots
from jobs.node.launcher import (
    Engine, LaunchError, LaunchStopped, PullInterrupted, RegistryAuth, RegistryHostUnknown, RegistryUnreachable,
)

log = logging.getLogger(__name__)

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


class LaunchSetAside(Exception):
    """The launch waits, off the node's launch threads, and is handed back
    (ImageGate's `relaunch`) when what it waits for ends. `note`: what its
    task's platform log says of it, if anything."""

    def __init__(self, note: str = "") -> None:
        super().__init__(note)
        self.note = note


def _outcome_of_call(work: Callable[[], None], image: str, auth: RegistryAuth | None, pulled: bool) -> _Outcome:
    try:
        work()
    except LaunchError as exc:
        return _Outcome(image, auth, pulled, exc)
    except Exception as exc:  # our own failure: the task fails as the platform's
        log.exception("making sure of image %s failed", image)
        return _Outcome(image, auth, pulled, LaunchError(ExitType.PLATFORM, f"{exc.__class__.__name__}: {exc}"))
    return _Outcome(image, auth, pulled, None)


def _outcome_of_wait(work: Callable[[], None], stopped: Callable[[], bool], image: str,
                     auth: RegistryAuth | None, pulled: bool) -> _Outcome:
    """As _outcome_of_call, on a thread of its own; LaunchStopped if the
    task is stopped first."""
    try:
        _wait_unless_stopped(work, stopped, image)
    except LaunchError as exc:
        return _Outcome(image, auth, pulled, exc)
    return _Outcome(image, auth, pulled, None)


class PullDeferred(LaunchSetAside):
    """The task's owner has their share of pulls under way on this node: its
    launch waits for one of them to end."""


# How long a launch thread waits for its image's check or pull before the
# launch is set aside until it ends (finding 47): the usual check (a few ms)
# or small pull is over by then, and costs no hand-back.
ASIDE_AFTER_SECONDS = 2.0
# Asking an unreachable registry again (finding 46): after 2 s, then twice
# as long each time, at most a minute apart.
REGISTRY_RETRY_FIRST, REGISTRY_RETRY_MAX = 2.0, 60.0


def _why_given_up(registry: str, *, dropped: bool, limit: float) -> str:
    """Why a launch that waited for its registry (or could not) fails."""
    after = f" for {limit} s (IMAGE_PULL_REGISTRY_WAIT_SECONDS)" if limit else ""
    if dropped:
        return f"the registry {registry} broke off the pull" + (f", again after trying{after}" if limit else "")
    return f"the registry {registry} could not be reached{after}"


@dataclass(frozen=True)
class _Outcome:
    """How an attempt's check or pull, on a thread of its own, ended."""
    image: str
    auth: RegistryAuth | None
    pulled: bool
    error: LaunchError | None


class _Aside:
    """An attempt's check or pull on a thread of its own, and its outcome."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.set_aside = False  # the launch stopped waiting: hand it back at the end
        self.outcome: _Outcome | None = None


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
        self._relaunch = relaunch  # hands back an attempt set aside (`slots`, a check or pull, a registry wait)
        self._lock = threading.Lock()
        self._underway: dict[int, _Aside] = {}  # attempts set aside while their check or pull runs
        self._outcomes: dict[int, _Outcome] = {}  # how it ended, for the launch handed back
        self._timers: dict[int, threading.Timer] = {}  # attempts to ask their unreachable registry again
        self._unreachable_since: dict[int, tuple[float, int]] = {}  # since when (monotonic), and tries so far
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
               stopped: Callable[[], bool] | None = None, owner: int | None = None, aside: bool = True) -> None:
        """`attempt_id`: the task attempt whose launch waits, to show its pull
        on the job page. `stopped`: whether its task was stopped meanwhile;
        then the launch stops waiting for the pull (LaunchStopped). The pull
        goes on: Docker cancels one only when its connection is lost, and
        another task may want the image; its record still ends. `owner`: the
        user whose share of pulls (PullSlots) this one counts in; over it,
        PullDeferred.

        With `relaunch` and an attempt, a check or pull that lasts (a big
        image, a registry that hangs) is waited for off the launch threads:
        LaunchSetAside, and the attempt handed back when it ends, whose
        launch then finds the outcome here; and a registry that cannot be
        reached is asked again later (RegistryWait), for
        IMAGE_PULL_REGISTRY_WAIT_SECONDS. `aside=False`: waited for here,
        and an unreachable registry fails the launch at once."""
        aside = aside and attempt_id is not None and stopped is not None and self._relaunch is not None
        outcome = self._outcome_of(attempt_id, image, auth)
        if outcome is not None:
            self._settle(outcome, note=note, attempt_id=attempt_id, stopped=stopped, can_wait=True)
            return
        present = self._present(image)
        recheck = present and (auth is not None or image in self.private or self._unknown(image))
        if present and not recheck:
            return
        try:
            refusal = node_registry_refusal(image, allowed=allowed)
        except RegistryUnreachable as exc:  # the node's DNS gave no answer: waited for as the registry would be
            unanswered = RegistryUnreachable(f"could not pull image {image}: {exc.message}")
            self._registry_unreachable(_Outcome(image, auth, False, unanswered), note=note, attempt_id=attempt_id,
                                       stopped=stopped, can_wait=aside)
        if refusal:
            raise LaunchError(ExitType.IMAGE_PULL, f"could not pull image {image}: {refusal}")
        if recheck:
            work = functools.partial(self._check_present, image, auth, note=note, attempt_id=attempt_id)
            self._await(work, image=image, auth=auth, pulled=False, note=note, attempt_id=attempt_id,
                        stopped=stopped, aside=aside)
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
            self._set_aside(attempt_id, stopped, PullDeferred(
                f"waiting to pull its image: this user has {self.slots.per_owner} image pulls under way on this "
                "node (IMAGE_PULLS_PER_USER)"))
        note(f"pulling image {image}")
        record = PullRecord(attempt_id, image) if attempt_id is not None else None

        def pull() -> None:
            try:
                self._pull(image, auth, record)
            finally:  # the pull itself ended, not the launch's wait for it
                if shared:
                    self._slot_freed(owner)

        self._await(pull, image=image, auth=auth, pulled=True, note=note, attempt_id=attempt_id, stopped=stopped,
                    aside=aside)

    def _await(self, work: Callable[[], None], *, image: str, auth: RegistryAuth | None, pulled: bool,
               note: Callable[[str], None], attempt_id: int | None, stopped: Callable[[], bool] | None,
               aside: bool) -> None:
        """Run `work` (a check or a pull) and settle its outcome: here, or,
        if it lasts and `aside`, set aside until it ends."""
        if not aside:
            outcome = _outcome_of_call(work, image, auth, pulled) if stopped is None else \
                _outcome_of_wait(work, stopped, image, auth, pulled)
            self._settle(outcome, note=note, attempt_id=attempt_id, stopped=stopped, can_wait=False)
            return
        underway = _Aside()

        def run() -> None:
            try:
                close_old_connections()
                outcome = _outcome_of_call(work, image, auth, pulled)
            finally:
                connection.close()  # this thread's own, opened by the pull's record
            with self._lock:
                underway.outcome = outcome
                underway.done.set()
                hand_back = underway.set_aside and self._underway.pop(attempt_id, None) is underway
                if hand_back:
                    self._outcomes[attempt_id] = outcome
            if hand_back:
                self._relaunch(attempt_id)

        threading.Thread(target=run, name=f"image-{image[:40]}", daemon=True).start()
        underway.done.wait(ASIDE_AFTER_SECONDS)
        with self._lock:
            set_aside = not underway.done.is_set()
            if set_aside:
                underway.set_aside = True
                self._underway[attempt_id] = underway
        if set_aside:
            self._set_aside(attempt_id, stopped, LaunchSetAside())
        self._settle(underway.outcome, note=note, attempt_id=attempt_id, stopped=stopped, can_wait=True)

    def _set_aside(self, attempt_id: int, stopped: Callable[[], bool] | None, aside: LaunchSetAside) -> NoReturn:
        """Raise `aside`, the attempt now set aside here; unless its task was
        stopped meanwhile: a stop that came before found nothing here to take
        back (withdraw), so the launch ends stopped now (LaunchStopped)."""
        if stopped is not None and stopped() and self.withdraw(attempt_id):
            raise LaunchStopped("stopped while it waited for its image")
        raise aside

    def _outcome_of(self, attempt_id: int | None, image: str, auth: RegistryAuth | None) -> _Outcome | None:
        """The outcome of this attempt's check or pull, ended while it was set
        aside; only for the same image and credentials (an authFile read
        again may have changed)."""
        if attempt_id is None:
            return None
        with self._lock:
            outcome = self._outcomes.pop(attempt_id, None)
        if outcome is None or (outcome.image, outcome.auth) != (image, auth):
            return None
        return outcome

    def _settle(self, outcome: _Outcome, *, note: Callable[[str], None], attempt_id: int | None,
                stopped: Callable[[], bool] | None, can_wait: bool) -> None:
        """Go on with the launch (the image is made sure of), or raise why not."""
        error = outcome.error
        if isinstance(error, RegistryUnreachable):
            self._registry_unreachable(outcome, note=note, attempt_id=attempt_id, stopped=stopped, can_wait=can_wait)
        if attempt_id is not None:
            with self._lock:
                self._unreachable_since.pop(attempt_id, None)
        if error is not None:
            raise error
        if outcome.auth is None or outcome.pulled:
            # Asked without credentials and let through, pulled without
            # credentials or with some it did not need (not recorded private).
            self._record_public(outcome.image)
        if outcome.pulled:
            note(f"pulled image {outcome.image}")

    def _registry_unreachable(self, outcome: _Outcome, *, note: Callable[[str], None], attempt_id: int | None,
                              stopped: Callable[[], bool] | None, can_wait: bool) -> NoReturn:
        """The registry could not be asked: wait and ask again (RegistryWait),
        or, past IMAGE_PULL_REGISTRY_WAIT_SECONDS, fail saying so. Nothing is
        started meanwhile, even an image the node has (finding 46)."""
        image, limit = outcome.image, settings.IMAGE_PULL_REGISTRY_WAIT_SECONDS
        detail = outcome.error.message.removeprefix(f"could not pull image {image}: ")
        registry = registry_of(image)
        if not outcome.pulled:
            note(f"pulling image {image}")  # told as a pull's would be (finding 35)
        now = time.monotonic()
        with self._lock:
            since, tries = self._unreachable_since.get(attempt_id, (now, 0)) if attempt_id is not None else (now, 0)
        waited = now - since
        # A pull the registry broke off (PullInterrupted) is pulled again, as
        # an unreachable registry is asked again; each says which it was.
        dropped = isinstance(outcome.error, PullInterrupted)
        if not can_wait or attempt_id is None or waited >= limit:
            with self._lock:
                self._unreachable_since.pop(attempt_id, None)
            message = f"could not pull image {image}: {_why_given_up(registry, dropped=dropped, limit=limit)}: {detail}"
            if attempt_id is not None:
                services.pull_wait(attempt_id=attempt_id, image=image, error=message)
                services.pull_finish(attempt_id=attempt_id, counts=services.PullCounts(), error=message)
            raise LaunchError(ExitType.IMAGE_PULL, message)
        delay = min(REGISTRY_RETRY_FIRST * 2 ** tries, REGISTRY_RETRY_MAX, max(0.0, limit - waited))
        what = (f"the registry {registry} broke off the pull: {detail}; pulling again" if dropped else
                f"the registry {registry} could not be reached: {detail}; asking again")
        message = (f"{what} in {delay:.0f} s, for up to {limit} s in all (IMAGE_PULL_REGISTRY_WAIT_SECONDS)")
        services.pull_wait(attempt_id=attempt_id, image=image, error=message)
        timer = threading.Timer(delay, self._ask_again, args=(attempt_id,))
        timer.daemon = True
        with self._lock:
            self._unreachable_since[attempt_id] = (since, tries + 1)
            self._timers[attempt_id] = timer
        timer.start()
        self._set_aside(attempt_id, stopped, LaunchSetAside(f"waiting for the registry: {message}"))

    def _ask_again(self, attempt_id: int) -> None:
        with self._lock:
            if self._timers.pop(attempt_id, None) is None:
                return  # withdrawn meanwhile
        self._relaunch(attempt_id)

    def withdraw(self, attempt_id: int) -> bool:
        """Take back an attempt set aside here (its task was stopped), to be
        handed back at once; False if it is not set aside. A check or pull
        under way goes on, and its outcome is dropped."""
        with self._lock:
            timer = self._timers.pop(attempt_id, None)
            aside = self._underway.pop(attempt_id, None)
        if timer is not None:
            timer.cancel()
        return timer is not None or aside is not None or self.slots.withdraw(attempt_id)

    def finished(self, attempt_id: int) -> None:
        """The attempt's launch ended (started, failed or stopped): forget it."""
        with self._lock:
            self._outcomes.pop(attempt_id, None)
            self._unreachable_since.pop(attempt_id, None)

    def _slot_freed(self, owner: int) -> None:
        waiting = self.slots.release(owner)
        if waiting is not None and self._relaunch is not None:
            self._relaunch(waiting)

    def _pull(self, image: str, auth: RegistryAuth | None, record: PullRecord | None) -> None:
        limits = {"stall_seconds": settings.IMAGE_PULL_STALL_SECONDS or None,
                  "max_mb": settings.IMAGE_PULL_MAX_MB or None, "max_seconds": settings.IMAGE_PULL_MAX_SECONDS or None,
                  "max_unpacked_mb": settings.IMAGE_MAX_UNPACKED_MB or None,
                  "min_free_mb": settings.IMAGE_PULL_MIN_FREE_MB or None}
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
        except RegistryUnreachable:
            raise  # the launch waits (pull_wait) or fails, and says so
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
        except RegistryUnreachable:
            raise  # told when the launch settles it (_registry_unreachable)
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
        except RegistryUnreachable as exc:
            raise RegistryUnreachable(f"could not pull image {image}: {exc.message}") from None
        except RegistryHostUnknown as exc:  # told as the node's own DNS check tells it (node_registry_refusal)
            raise LaunchError(ExitType.IMAGE_PULL, f"could not pull image {image}: "
                                                   f"{no_such_registry(registry_of(image), exc.message)}") from None
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
