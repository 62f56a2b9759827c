"""The group commit of submissions (jobs/services/job_store.py), watched
through the database itself: every statement the submitting threads run is
traced (`traced`), so a test sees each transaction (BEGIN ... COMMIT or
ROLLBACK) and the rows each INSERT carries. On SQLite and on PostgreSQL.

To make a batch without timing luck, the test holds the write lock the
submissions need itself (as a write in another process would; SQLite's
database lock, or PostgreSQL's lock on the jobs table): the first submission
leads and waits at its first write, the next ones queue behind it in this
process, one at a time so their order is known, and when the test lets go
the first is written alone and the queued ones together.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from redis.exceptions import ConnectionError as RedisConnectionError

from jobs import services
from jobs.models import Job, JobAttempt, Task, VirtualCluster
from jobs.services import job_store, rows
from tests.cluster import wait_for

pytestmark = pytest.mark.services


def _config(name: str, vc: str = "default") -> str:
    return json.dumps({
        "jobName": name, "image": "pai-local/busybox:latest", "virtualCluster": vc,
        "taskRoles": [{"name": "main", "taskNumber": 2, "cpuNumber": 1, "memoryMB": 100, "gpuNumber": 0,
                       "command": "true"},
                      {"name": "side", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 100, "gpuNumber": 0,
                       "command": "true"}],
    })


@dataclass
class Transaction:
    thread: str
    statements: list[str]
    end: int = -1  # where it ended in the log

    @property
    def committed(self) -> bool:
        # A COMMIT that fails (a deferred foreign key) is followed by a ROLLBACK.
        return self.statements[-1] == "COMMIT"

    def inserts(self, table: str) -> list[str]:
        return [s for s in self.statements if s.startswith(f'INSERT INTO "{table}"')]


@dataclass
class Submissions:
    """Submissions made in threads of their own, every statement traced."""

    owner: object
    log: list[tuple[str, str]] = field(default_factory=list)  # (who, statement or "returned"), in order
    results: dict[str, Job | services.SubmitError] = field(default_factory=dict)
    seen_at_return: dict[str, bool] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, who: str, name: str, vc: str = "default") -> None:
        thread = threading.Thread(target=self._submit, args=(who, name, vc), name=who)
        self.threads.append(thread)
        thread.start()

    def _submit(self, who: str, name: str, vc: str) -> None:
        try:
            with traced(self.log, who):
                try:
                    job = services.job_submit(owner=self.owner, config=_config(name, vc))
                except services.SubmitError as exc:
                    self.results[who] = exc
                    return
                self.log.append((who, "returned"))
                self.seen_at_return[who] = _committed_row_exists(job.pk)
                self.results[who] = job
        finally:
            connection.close()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive(), f"submission {thread.name} never returned"

    def began(self, who: str) -> bool:
        return began(self.log, who)

    def transactions(self) -> list[Transaction]:
        """Every transaction of the submitting threads, in the order they began."""
        found: list[Transaction] = []
        current: dict[str, Transaction] = {}
        for position, (who, statement) in enumerate(self.log):
            if statement.startswith("BEGIN"):
                current[who] = Transaction(who, [])
                found.append(current[who])
            elif who in current and current[who].end >= 0 and statement != "ROLLBACK":
                del current[who]  # ended with its COMMIT
            if who in current:
                current[who].statements.append(statement)
                if statement in ("COMMIT", "ROLLBACK"):
                    current[who].end = position
                if statement == "ROLLBACK":
                    del current[who]
        assert all(t.end >= 0 for t in found), "a transaction never ended"
        return found

    def stored_in(self, name: str) -> list[Transaction]:
        """The transactions whose INSERT of jobs carries `name`."""
        return [t for t in self.transactions() for s in t.inserts("jobs_job") if carries(s, name)]


@contextmanager
def traced(log: list[tuple[str, str]], who: str) -> Iterator[None]:
    """Every statement this thread's connection runs goes into `log` as
    (who, SQL with its values), BEGIN, COMMIT and ROLLBACK included. SQLite
    reports them all itself (and its triggers' work, left out here). On PostgreSQL psycopg sends BEGIN just before
    the first statement of a transaction, and Django ends transactions
    through the driver, not in SQL, so those three are noted where they
    happen."""
    connection.ensure_connection()
    if connection.vendor == "sqlite":
        last = [""]

        def note(sql: str) -> None:
            # The job list's name index (migration 0015) is not the
            # submission's doing: its trigger's program is reported as the
            # statement that fired it once more, and the full-text index's own
            # statements name their tables 'main'.'...' or come as "-- ...".
            if not sql.startswith("--") and "'main'." not in sql and sql != last[0]:
                log.append((who, sql))
                last[0] = sql

        connection.connection.set_trace_callback(note)
        try:
            yield
        finally:
            if connection.connection is not None:
                connection.connection.set_trace_callback(None)
        return
    database = connections[DEFAULT_DB_ALIAS]  # this thread's own
    in_transaction = False

    def execute(run, sql, params, many, context):
        nonlocal in_transaction
        if not database.get_autocommit() and not in_transaction:
            in_transaction = True
            log.append((who, "BEGIN"))
        for one in (params if many else [params]):
            log.append((who, database.ops.compose_sql(sql, one)))
        return run(sql, params, many, context)

    def noted(what: str, end: Callable[[], None]) -> Callable[[], None]:
        def noting() -> None:
            nonlocal in_transaction
            in_transaction = False
            log.append((who, what))
            end()
        return noting

    database._commit = noted("COMMIT", database._commit)
    database._rollback = noted("ROLLBACK", database._rollback)
    try:
        with database.execute_wrapper(execute):
            yield
    finally:
        del database._commit, database._rollback


def carries(statement: str, name: str) -> bool:
    """Whether an INSERT carries the job name `name`: a quoted value, or an
    element of PostgreSQL's UNNEST arrays ('{a,b}')."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", statement) is not None


def began(log: list[tuple[str, str]], who: str) -> bool:
    return any(w == who and statement.startswith("BEGIN") for w, statement in log)


def _committed_row_exists(job_id: int) -> bool:
    """Asked on a connection of its own, which sees only committed rows."""
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT 1 FROM jobs_job WHERE id = %s", [job_id])
            return cursor.fetchone() is not None
    finally:
        other.close()


@contextmanager
def write_lock_held(*, commit: bool = False) -> Iterator[None]:
    """Hold the write lock a submission needs on this thread's connection;
    rolled back after, unless `commit`. SQLite: the database's own, taken at
    BEGIN IMMEDIATE. PostgreSQL: the jobs table's, in a mode that lets reads
    through and makes every INSERT wait."""
    with transaction.atomic():
        if connection.vendor != "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("LOCK TABLE jobs_job IN SHARE ROW EXCLUSIVE MODE")
        yield
        transaction.set_rollback(not commit)


def queue_behind_a_write(submissions: Submissions, lead: tuple[str, str], *queued: tuple[str, ...],
                         meanwhile: Callable[[], None] | None = None) -> None:
    """`lead` becomes the leader and waits at BEGIN for the lock this thread
    holds; the others queue behind it in order. `meanwhile` runs in the
    held transaction (committed with it). Returns once every submission is
    stored or refused."""
    assert not job_store._queue.writing and not job_store._queue.waiting
    jobs_before = Job.objects.filter(owner=submissions.owner).count()
    with write_lock_held(commit=meanwhile is not None):
        submissions.start(*lead)
        wait_for(lambda: submissions.began(lead[0]), interval=0.01, what=f"{lead[0]} to begin its write")
        for count, args in enumerate(queued, start=1):
            submissions.start(*args)
            wait_for(lambda: len(job_store._queue.waiting) == count, interval=0.01, what=f"{args[0]} to queue")
        assert submissions.results == {}  # nobody has a job while nothing is committed
        assert Job.objects.filter(owner=submissions.owner).count() == jobs_before
        if meanwhile is not None:
            meanwhile()
    submissions.join()
    assert not job_store._queue.writing and not job_store._queue.waiting


def assert_stored_whole(owner, name: str, job: Job) -> None:
    """The caller's job is the stored row, with its first attempt and every task."""
    assert isinstance(job, Job), f"{name}: {job}"
    stored = Job.objects.get(owner=owner, name=name)
    assert job.pk == stored.pk
    assert list(JobAttempt.objects.filter(job=stored).values_list("number", flat=True)) == [1]
    assert sorted(Task.objects.filter(job=stored).values_list("role", "index")) == [("main", 0), ("main", 1), ("side", 0)]


def test_it_writes_a_lone_submission_at_once_in_one_transaction(alice, redis_server):
    submissions = Submissions(alice)
    submissions.start("a", "alone")
    submissions.join()
    [only] = submissions.transactions()
    assert only.committed and only.thread == "a"
    assert len(only.inserts("jobs_job")) == 1
    assert only.inserts("jobs_jobattempt") and only.inserts("jobs_task")  # in the same transaction
    assert_stored_whole(alice, "alone", submissions.results["a"])


def test_sqlite_connections_keep_temporary_storage_in_memory(alice, redis_server):
    """On SQLite a job's INSERT needs temporary storage; as a file it cost
    a new inode in /var/tmp per submission (portal/settings.py). Asked on
    the connection a submitting thread opens, as the web workers' are."""
    if connection.vendor != "sqlite":
        pytest.skip("a setting of SQLite's connections")
    seen: list[int] = []

    def submit() -> None:
        try:
            services.job_submit(owner=alice, config=_config("tempstore"))
            with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
                cursor.execute("PRAGMA temp_store")
                seen.append(cursor.fetchone()[0])
        finally:
            connections.close_all()

    thread = threading.Thread(target=submit)
    thread.start()
    thread.join()
    assert seen == [2]  # MEMORY


def test_it_stores_submissions_queued_behind_a_write_in_one_transaction(alice, redis_server):
    submissions = Submissions(alice)
    queued = [(f"q{i}", f"sweep-{i}") for i in range(6)]
    queue_behind_a_write(submissions, ("lead", "first"), *queued)

    first, batch = submissions.transactions()
    assert first.thread == "lead" and first.committed
    assert batch.thread == "q0" and batch.committed  # the oldest in the queue leads the next write
    # One INSERT of jobs for the whole batch, every job in it; their
    # attempts and tasks in the same transaction.
    [jobs_insert] = batch.inserts("jobs_job")
    assert all(carries(jobs_insert, f"sweep-{i}") for i in range(6))
    assert batch.inserts("jobs_jobattempt") and batch.inserts("jobs_task")
    for who, name in [("lead", "first"), *queued]:
        assert_stored_whole(alice, name, submissions.results[who])


def test_a_batch_longer_than_one_statement_takes_is_inserted_in_parts_each_job_with_its_own_id(alice, redis_server,
                                                                                             monkeypatch):
    # RETURNING promises no order: each job finds its id by owner and name.
    monkeypatch.setattr(rows, "SAVE_NEW_BATCH", 2)
    submissions = Submissions(alice)
    queued = [(f"q{i}", f"part-{i}") for i in range(5)]
    queue_behind_a_write(submissions, ("lead", "first"), *queued)

    _, batch = submissions.transactions()
    assert batch.committed and len(batch.inserts("jobs_job")) == 3
    for who, name in [("lead", "first"), *queued]:
        assert_stored_whole(alice, name, submissions.results[who])
        assert submissions.results[who]._state.adding is False


def test_it_hands_each_caller_its_job_only_once_that_job_is_committed(alice, redis_server):
    submissions = Submissions(alice)
    queued = [(f"q{i}", f"after-{i}") for i in range(4)]
    queue_behind_a_write(submissions, ("lead", "before"), *queued)

    # Each caller, the moment it has its job, finds the row from a
    # connection of its own; and the COMMIT came first in the log.
    assert submissions.seen_at_return == {who: True for who in ["lead", *(who for who, _ in queued)]}
    for who, name in [("lead", "before"), *queued]:
        [stored] = submissions.stored_in(name)
        assert stored.committed and stored.end < submissions.log.index((who, "returned"))


def test_a_taken_name_fails_only_its_own_job(alice, redis_server):
    services.job_submit(owner=alice, config=_config("taken"))
    submissions = Submissions(alice)
    queue_behind_a_write(submissions, ("lead", "lead-job"), ("q0", "fresh-0"), ("q1", "taken"), ("q2", "fresh-1"))

    error = submissions.results["q1"]
    assert isinstance(error, services.SubmitError)
    assert (error.code, error.field, error.message) == ("ConflictJobError", "jobName",
                                                        'you already have a job named "taken"')
    assert Job.objects.filter(owner=alice, name="taken").count() == 1
    for who, name in [("lead", "lead-job"), ("q0", "fresh-0"), ("q2", "fresh-1")]:
        assert_stored_whole(alice, name, submissions.results[who])
    # The batch was tried whole and rolled back, then each job on its own;
    # nothing of the rolled-back tries survives.
    transactions = submissions.transactions()
    assert [t.committed for t in transactions] == [True, False, True, False, True]
    assert len(transactions[1].inserts("jobs_job")) == 1
    assert Task.objects.filter(job__owner=alice).count() == 4 * 3
    assert JobAttempt.objects.filter(job__owner=alice).count() == 4


def test_a_name_given_twice_in_one_batch_is_stored_once_for_whoever_asked_first(alice, redis_server):
    submissions = Submissions(alice)
    queue_behind_a_write(submissions, ("lead", "other"), ("q0", "twice"), ("q1", "sweep"), ("q2", "twice"))

    assert_stored_whole(alice, "twice", submissions.results["q0"])
    error = submissions.results["q2"]
    assert isinstance(error, services.SubmitError) and error.code == "ConflictJobError"
    assert_stored_whole(alice, "sweep", submissions.results["q1"])
    assert Job.objects.filter(owner=alice, name="twice").count() == 1
    assert Task.objects.filter(job__owner=alice).count() == 3 * 3


def only_the_job_stores_wake_ups(monkeypatch, request_schedule: Callable[[], None]) -> None:
    """`request_schedule` in place of the job store's wake-up alone. The
    queues module's own stays: stopping the test's unfinished jobs at
    teardown asks for a pass through it, before monkeypatch undoes anything
    (pytest-django sets monkeypatch up first), and on a cluster whose
    agents had placed them got the stand-in (CI 117, PostgreSQL pass)."""
    monkeypatch.setattr(job_store, "queues", SimpleNamespace(request_schedule=request_schedule))


def test_the_scheduler_is_woken_once_a_batch_is_committed_and_its_write_over(alice, redis_server, monkeypatch):
    wake_ups: list[tuple[list[bool], bool]] = []
    submissions = Submissions(alice)
    queued = [(f"q{i}", f"wake-{i}") for i in range(3)]

    def request_schedule() -> None:
        # Per wake-up: which of its write's jobs are committed, and whether
        # the next write could begin meanwhile.
        names = ["wake-lead"] if not wake_ups else [name for _, name in queued]
        committed = [Job.objects.filter(owner=alice, name=name).exists() for name in names]
        wake_ups.append((committed, job_store._queue.writing))

    only_the_job_stores_wake_ups(monkeypatch, request_schedule)
    queue_behind_a_write(submissions, ("lead", "wake-lead"), *queued)

    for who, name in [("lead", "wake-lead"), *queued]:
        assert_stored_whole(alice, name, submissions.results[who])
    # The leader's job alone, then the queued three together: one wake-up
    # each write, after its commit. The first one's write was over (the lead
    # handed on to the queued ones: `writing` stays set for them), the last
    # one's too, with nothing left to write.
    assert wake_ups == [([True], True), ([True] * 3, False)]


def test_a_scheduler_out_of_reach_fails_no_stored_job(alice, redis_server, monkeypatch):
    """Redis lost between the checks and the commit: the jobs are stored,
    and their owners are told so (a node agent's next pass finds them).
    Raised from the commit, it once had the batch written again one by one,
    and told the owners of stored jobs that their names were taken."""
    def request_schedule() -> None:
        raise RedisConnectionError("Redis went away")

    only_the_job_stores_wake_ups(monkeypatch, request_schedule)
    submissions = Submissions(alice)
    queued = [(f"q{i}", f"unwoken-{i}") for i in range(3)]
    queue_behind_a_write(submissions, ("lead", "unwoken-lead"), *queued)
    for who, name in [("lead", "unwoken-lead"), *queued]:
        assert_stored_whole(alice, name, submissions.results[who])
    with transaction.atomic():
        job = services.job_submit(owner=alice, config=_config("unwoken-inside"))
    assert_stored_whole(alice, "unwoken-inside", job)


def submit_while_the_virtual_cluster_is_deleted(alice) -> Submissions:
    """An admin deletes a virtual cluster while a submission to it waits to
    be written with others: its job can no longer be stored (the foreign
    key fails at COMMIT)."""
    doomed = VirtualCluster.objects.create(name=f"doomed_{alice.username}", open_to_all=True)
    submissions = Submissions(alice)
    queue_behind_a_write(submissions, ("lead", "lead-job"), ("q0", "kept-0"), ("q1", "orphan", doomed.name),
                         ("q2", "kept-1"), meanwhile=doomed.delete)  # no job of it is stored yet: nothing protects it
    return submissions


def test_a_job_the_database_refuses_does_not_lose_the_rest_of_its_batch(alice, redis_server):
    submissions = submit_while_the_virtual_cluster_is_deleted(alice)

    for who, name in [("lead", "lead-job"), ("q0", "kept-0"), ("q2", "kept-1")]:
        assert_stored_whole(alice, name, submissions.results[who])
    assert isinstance(submissions.results["q1"], services.SubmitError)
    assert not Job.objects.filter(owner=alice, name="orphan").exists()
    transactions = submissions.transactions()
    assert [t.committed for t in transactions] == [True, False, True, False, True]
    assert transactions[1].statements[-2:] == ["COMMIT", "ROLLBACK"]  # refused at COMMIT
    assert Task.objects.filter(job__owner=alice).count() == 3 * 3


def test_a_job_the_database_refuses_is_not_said_to_have_a_taken_name(alice, redis_server):
    submissions = submit_while_the_virtual_cluster_is_deleted(alice)
    error = submissions.results["q1"]
    assert error.code == "NoVirtualClusterError", error.message
    assert "removed" in error.message


def test_a_job_whose_data_cannot_be_written_does_not_lose_the_rest_of_its_batch(alice, redis_server):
    # Through store() itself: job_submit's limits keep such a value out, but
    # the batch must not depend on every caller's data being writable.
    default = VirtualCluster.objects.get(name=VirtualCluster.DEFAULT)
    outcomes: dict[str, str] = {}
    log: list[tuple[str, str]] = []

    def store(name: str, retry_limit: int) -> None:
        try:
            with traced(log, name):
                job = Job(owner=alice, name=name, virtual_cluster=default, config_raw="{}", config={},
                          retry_limit=retry_limit)
                job_store.store(job, roles=[("main", 1)])
            outcomes[name] = "stored"
        except Exception as exc:
            outcomes[name] = type(exc).__name__
        finally:
            connection.close()

    threads = []
    with write_lock_held():
        for count, (name, retry_limit) in enumerate([("lead", 0), ("a", 0), ("too-big", 2**70), ("b", 0)]):
            threads.append(threading.Thread(target=store, args=(name, retry_limit)))
            threads[-1].start()
            if count == 0:
                wait_for(lambda: began(log, "lead"), interval=0.01, what="the leader to begin")
            else:
                wait_for(lambda: len(job_store._queue.waiting) == count, interval=0.01, what=f"{name} to queue")
    for thread in threads:
        thread.join(60)
    # sqlite3 refuses the value in Python; PostgreSQL says "integer out of range".
    too_big = "OverflowError" if connection.vendor == "sqlite" else "DataError"
    assert outcomes == {"lead": "stored", "a": "stored", "too-big": too_big, "b": "stored"}


def test_a_submission_inside_a_callers_transaction_commits_and_rolls_back_with_it(alice, redis_server):
    with transaction.atomic():
        job = services.job_submit(owner=alice, config=_config("inside"))
        assert Job.objects.filter(pk=job.pk).exists() and not _committed_row_exists(job.pk)
        transaction.set_rollback(True)
    assert not Job.objects.filter(owner=alice, name="inside").exists()
    assert not job_store._queue.writing and not job_store._queue.waiting
    assert_stored_whole(alice, "inside", services.job_submit(owner=alice, config=_config("inside")))
