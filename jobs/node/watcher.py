"""Following one task's container after its start: its two log streams into
the database, its exit, its outputs, its clean-up. One thread per container
(and one more for stderr), for as long as the container runs.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connection

from jobs import services
from jobs.models import ACTIVE_TASK_STATES, ExitType, Stream, TaskAttempt, TaskState
from jobs.node.context import NodeContext
from jobs.node.logwriter import LineAssembler
from jobs.node.staging import output_target, owner_reader, upload_output

log = logging.getLogger(__name__)


class TaskWatcher(threading.Thread):
    """Follows one container: its two log streams, its exit, its clean-up."""

    def __init__(self, context: NodeContext, attempt_id: int, container_id: str) -> None:
        super().__init__(name=f"task-{attempt_id}", daemon=True)
        self.context = context
        self.engine = context.engine
        self.writer = context.writer
        self.attempt_id = attempt_id
        self.container_id = container_id
        self._stop_requests = 0
        self._kill_timer: threading.Timer | None = None

    def run(self) -> None:
        try:
            self._probe_ssh()
            stderr = threading.Thread(target=self._follow_safely, args=(Stream.STDERR,), daemon=True)
            stderr.start()
            self._follow_safely(Stream.STDOUT)
            stderr.join()
            self._finish()
        except Exception:
            log.exception("watching task attempt %s failed", self.attempt_id)
        finally:
            if self._kill_timer:
                self._kill_timer.cancel()
            self.context.watchers.pop(self.attempt_id)
            self.engine.close_thread_client()
            connection.close()

    def request_stop(self) -> None:
        """SIGTERM now, SIGKILL after the grace period; a second request kills at once."""
        self._stop_requests += 1
        if self._stop_requests > 1:
            self.engine.signal(self.container_id, "SIGKILL")
            return
        self.engine.signal(self.container_id, "SIGTERM")
        self._kill_timer = threading.Timer(settings.STOP_GRACE_SECONDS, self.engine.signal, (self.container_id, "SIGKILL"))
        self._kill_timer.daemon = True
        self._kill_timer.start()

    def _probe_ssh(self) -> None:
        attempt = TaskAttempt.objects.filter(pk=self.attempt_id).only("ssh_available", "state").first()
        if attempt is None or attempt.ssh_available is not None:
            return
        code = self.engine.exec_status(self.container_id, ["/bin/sh", "-c", "test -x /usr/sbin/sshd"])
        if code is not None:
            services.attempt_set_ssh_available(self.attempt_id, available=code == 0)

    def _follow_safely(self, stream: int) -> None:
        try:
            self._follow(stream)
        except Exception:
            log.exception("following %s of task attempt %s failed", Stream(stream).label, self.attempt_id)
        finally:
            self.engine.close_thread_client()
            connection.close()

    def _follow(self, stream: int) -> None:
        cursor = self.writer.open(self.attempt_id, stream)
        if cursor.truncated:
            return
        position = (cursor.last_ts_ns, cursor.count_at_ts)
        while True:
            assembler = LineAssembler(last_ts_ns=position[0], count_at_ts=position[1],
                                      max_line_chars=settings.LOG_MAX_LINE_CHARS)
            for ts_ns, payload in self.engine.follow_logs(self.container_id, stream, since_ns=position[0]):
                if assembler.already_stored(ts_ns):
                    continue
                lines = assembler.feed(ts_ns, payload)
                if lines:
                    self.writer.add(self.attempt_id, stream, lines, assembler.cursor)
                    if self.writer.truncated(self.attempt_id, stream):
                        return
            state = self.engine.state(self.container_id)
            if state is None or not state.running:
                self.writer.add(self.attempt_id, stream, assembler.finish(), assembler.cursor)
                return
            # The stream broke while the container runs (engine restart):
            # follow again from the last complete line.
            position = assembler.cursor

    def _finish(self) -> None:
        state = self.engine.wait(self.container_id)
        attempt = TaskAttempt.objects.select_related("job", "job_attempt", "task").get(pk=self.attempt_id)
        if state is None:
            result = services.ContainerExit(None, exit_type=ExitType.PLATFORM, error="the container disappeared")
        else:
            result = services.ContainerExit(state.exit_code, oom_killed=state.oom_killed, error=state.error,
                                            finished_at=state.finished_at)
            if attempt.job.upload_outputs:
                self._upload_outputs(attempt)
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
        return TaskAttempt.objects.filter(
            job_attempt_id=attempt.job_attempt_id, state__in=ACTIVE_TASK_STATES,
            node__engine_id=self.context.node.engine_id,
        ).exists()

    def _upload_outputs(self, attempt: TaskAttempt) -> None:
        """Copy what the task left in /pai/output to outputDir."""
        target = output_target(attempt.job.spec, attempt.task.role, attempt.task.index)
        message = upload_output(self.engine, self.container_id, target, reader=owner_reader(attempt.job))
        if message:
            self.writer.note(self.attempt_id, message)
