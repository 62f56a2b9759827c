"""Following one task's container after its start: its two log streams into
the database, its exit, its outputs, its clean-up.

A TaskWatcher is no thread: the node's one log follower (follower.py) reads
its container's log socket and hands it the entries, and the follower's
helper threads run its blocking steps (opening the stream, recording the
exit, removing the container).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from django.conf import settings

from jobs import services
from jobs.models import ACTIVE_TASK_STATES, ExitType, Stream, TaskAttempt, TaskState
from jobs.node.context import NodeContext
from jobs.node.follower import Entries
from jobs.node.launcher import ContainerState
from jobs.node.logwriter import LineAssembler
from jobs.node.staging import output_target, owner_reader, upload_output
from jobs.services import db_clock

log = logging.getLogger(__name__)


@dataclass
class _Sink:
    """One stream of the container on its way to the log writer."""

    stream: int
    assembler: LineAssembler
    done: bool  # truncated: what comes is not stored


class TaskWatcher:
    """Follows one container: its two log streams, its exit, its clean-up."""

    def __init__(self, context: NodeContext, attempt_id: int, container_id: str) -> None:
        self.context = context
        self.engine = context.engine
        self.writer = context.writer
        self.follower = context.follower
        self.attempt_id = attempt_id
        self.container_id = container_id
        self._sinks: dict[int, _Sink] = {}
        self._stop_requests = 0
        self._stop_asked = threading.Event()  # ends an output upload's wait for storage
        self._finished = False
        self._state: ContainerState | None = None  # the stopped container's, between its last two reads

    def start(self) -> None:
        self.follower.submit(self._begin)

    def request_stop(self) -> None:
        """SIGTERM now, SIGKILL after the grace period; a second request kills at once."""
        self._stop_requests += 1
        self._stop_asked.set()
        if self._stop_requests > 1:
            self.engine.signal(self.container_id, "SIGKILL")
            return
        self._terminate()

    def ensure_stopping(self) -> None:
        """SIGTERM and SIGKILL after the grace period, unless a stop was
        asked of this watcher already: for a stop the database holds whose
        request never reached it (lost with Redis, or with the agent that had
        it). Not a request of its own: the request itself, arriving after
        this, must not count as a second one and kill at once."""
        if self._stop_asked.is_set():
            return
        self._stop_asked.set()
        self._terminate()

    def _terminate(self) -> None:
        """SIGTERM now, SIGKILL once the grace period is over."""
        self.engine.signal(self.container_id, "SIGTERM")
        self.follower.call_later(settings.STOP_GRACE_SECONDS, self._kill_if_running)

    def _kill_if_running(self) -> None:
        if not self._finished:
            self.engine.signal(self.container_id, "SIGKILL")

    # ------------------------------------------------------------- following

    def _begin(self) -> None:
        """On a helper: the stored cursors, then the stream, then (its lines
        already on their way) whether the image has sshd."""
        try:
            for stream in (Stream.STDOUT, Stream.STDERR):
                cursor = self.writer.open(self.attempt_id, stream)
                self._sinks[stream] = _Sink(stream, self._assembler((cursor.last_ts_ns, cursor.count_at_ts)),
                                            done=cursor.truncated)
            self._follow()
        except Exception:
            log.exception("watching task attempt %s failed", self.attempt_id)
            self.context.watchers.pop(self.attempt_id)  # reconciliation watches it again
            return
        try:
            self._probe_ssh()
        except Exception:  # the page then just does not offer SSH; the task is followed all the same
            log.exception("probing task attempt %s for sshd failed", self.attempt_id)

    @staticmethod
    def _assembler(position: tuple[int, int]) -> LineAssembler:
        return LineAssembler(last_ts_ns=position[0], count_at_ts=position[1], max_line_chars=settings.LOG_MAX_LINE_CHARS)

    def _follow(self, *, to_the_end: bool = False) -> None:
        live = [sink.assembler.cursor[0] for sink in self._sinks.values() if not sink.done]
        since = min(live) if live else max(sink.assembler.cursor[0] for sink in self._sinks.values())
        stream = self.engine.open_logs(self.container_id, since_ns=since, follow=not to_the_end)
        self.follower.follow(stream, on_entries=self._take, on_end=self._read_the_rest if to_the_end else self._ended)

    def _take(self, entries: Entries) -> None:
        """On the follower's thread: entries become lines, one batch per
        stream and read, each with the cursor after its last line."""
        batches: dict[int, list[str]] = {}
        for stream, ts_ns, payload in entries:
            sink = self._sinks.get(stream)
            if sink is None or sink.done or sink.assembler.already_stored(ts_ns):
                continue
            lines = sink.assembler.feed(ts_ns, payload)
            if lines:
                batches.setdefault(stream, []).extend(lines)
        for stream, lines in batches.items():
            sink = self._sinks[stream]
            self.writer.add(self.attempt_id, stream, lines, sink.assembler.cursor)
            if self.writer.truncated(self.attempt_id, stream):
                sink.done = True

    def _ended(self) -> None:
        """On a helper, once the stream ended: the container stopped, or the
        connection broke while it runs (an engine restart), and then we
        follow again from the last complete line of each stream."""
        try:
            state = self.engine.state(self.container_id)
            for sink in self._sinks.values():
                sink.assembler = self._assembler(sink.assembler.cursor)
            if state is not None and state.running:
                # Not at once: an engine that keeps refusing the stream
                # (restarting, a log driver it cannot read) would be asked
                # again and again.
                self.follower.call_later(0.5, self._follow_again)
                return
            self._state = state
            # Docker (20.10) may end a followed stream before its last entry
            # (a last line without a newline): read once more, from the last
            # complete line, what is stored, and finish after that.
            self._follow(to_the_end=True)
        except Exception:
            log.exception("watching task attempt %s failed", self.attempt_id)
            self.context.watchers.pop(self.attempt_id)

    def _read_the_rest(self) -> None:
        """On a helper, after the last read of a stopped container."""
        try:
            for sink in self._sinks.values():
                if not sink.done:
                    self.writer.add(self.attempt_id, sink.stream, sink.assembler.finish(), sink.assembler.cursor)
            self._finish(self._state)
        except Exception:
            log.exception("watching task attempt %s failed", self.attempt_id)
            self.context.watchers.pop(self.attempt_id)

    def _follow_again(self) -> None:
        try:
            self._follow()
        except Exception:
            log.exception("following task attempt %s again failed", self.attempt_id)
            self.context.watchers.pop(self.attempt_id)  # reconciliation watches it again

    def _probe_ssh(self) -> None:
        attempt = TaskAttempt.objects.filter(pk=self.attempt_id).only("ssh_available", "state").first()
        if attempt is None or attempt.ssh_available is not None:
            return
        code = self.engine.exec_status(self.container_id, ["/bin/sh", "-c", "test -x /usr/sbin/sshd"])
        if code is not None:
            services.attempt_set_ssh_available(self.attempt_id, available=code == 0)

    def _finish(self, state: ContainerState | None) -> None:
        self._finished = True
        try:
            self._record_exit(state)
        finally:
            self.context.watchers.pop(self.attempt_id)

    def _record_exit(self, state: ContainerState | None) -> None:
        attempt = TaskAttempt.objects.select_related("job", "job_attempt", "task").get(pk=self.attempt_id)
        if state is None:
            result = services.ContainerExit(None, exit_type=ExitType.PLATFORM, error="the container disappeared")
        else:
            result = services.ContainerExit(state.exit_code, oom_killed=state.oom_killed, error=state.error,
                                            finished_at=db_clock.from_local(state.finished_at))
            if attempt.job.upload_outputs and attempt.is_active:
                self._upload_outputs(attempt)
            elif attempt.job.upload_outputs:
                # Given up already (its node was lost while cut off): its job
                # may have run again since, and written outputDir.
                self.writer.note(self.attempt_id, "/pai/output was not uploaded: the task had been given up "
                                                  f"({attempt.exit_reason}), and its job may have run again since")
        # Every line and note is stored before the exit is recorded: a page
        # that shows the task ended shows all it printed.
        self.writer.barrier()
        services.attempt_record_exit(self.attempt_id, result)
        attempt.refresh_from_db()
        keep = (state is not None and attempt.state == TaskState.FAILED
                and attempt.job.spec.is_debug and attempt.exit_type in (ExitType.USER_EXIT, ExitType.OOM))
        network = attempt.job_attempt.network_name if attempt.ip else ""
        if keep:
            services.attempt_keep_for_debug(self.attempt_id)
            self.writer.note(self.attempt_id, f"jobEnvs.isDebug is true: container {self.container_id[:12]} is kept "
                                              f"on node {self.context.node.name} for debugging")
            if network:
                self.engine.disconnect(self.container_id, network)
        else:
            self.engine.remove(self.container_id)
        if network and not self._network_still_needed(attempt):
            self.engine.remove_network(network)
        if keep:
            self.writer.barrier()  # the note's stream state is written before it is forgotten
        self.writer.forget(self.attempt_id)

    def _network_still_needed(self, attempt: TaskAttempt) -> bool:
        """Other tasks of the job attempt on this engine may not have started
        yet (a created container does not hold the network): keep it for them.
        Reconciliation removes what is left once the attempt is over."""
        node = self.context.node
        # "This engine" is the engine's marker (Node.engine_identity), never docker info's ID.
        same_engine = {"node__engine_marker": node.engine_marker} if node.engine_marker else {"node_id": node.pk}
        return TaskAttempt.objects.filter(
            job_attempt_id=attempt.job_attempt_id, state__in=ACTIVE_TASK_STATES, **same_engine,
        ).exists()

    def _upload_outputs(self, attempt: TaskAttempt) -> None:
        """Copy what the task left in /pai/output to outputDir."""
        target = output_target(attempt.job.spec, attempt.task.role, attempt.task.index)
        message = upload_output(self.engine, self.container_id, target, reader=owner_reader(attempt.job),
                                note=lambda text: self.writer.note(self.attempt_id, text), stopped=self._stop_asked)
        if message:
            self.writer.note(self.attempt_id, message)
