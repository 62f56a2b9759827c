"""The models and the migrations agree: a model change without its
migration (an index added in Meta only, say) would leave databases made by
`migrate` without it, and benchmarks and tests would measure a schema no
install has."""

from __future__ import annotations

from django.core.management import call_command
from django.db import connection


def test_every_model_change_has_its_migration() -> None:
    # --check exits with an error when makemigrations would write one.
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def _indexed(table: str) -> set[tuple[str, ...]]:
    """The column lists of `table`'s indexes and unique constraints (empty
    for an expression index, which has none)."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return {tuple(info["columns"] or ()) for info in constraints.values() if info["index"] or info["unique"]}


def test_log_lines_are_indexed_once_by_attempt() -> None:
    # Migration 0016: the unique (attempt, stream, seq) index serves lookups
    # by attempt; no second index on the attempt alone slows every insert.
    indexed = _indexed("jobs_logline")
    assert ("attempt_id", "stream", "seq") in indexed
    assert ("attempt_id",) not in indexed


COVERED = [("jobs_job", "owner_id", ("owner_id", "name")),
           ("jobs_task", "job_id", ("job_id", "role", "index")),
           ("jobs_jobattempt", "job_id", ("job_id", "number")),
           ("jobs_taskattempt", "job_id", ("job_id", "number"))]


def test_jobs_tasks_and_attempts_are_indexed_once_by_their_foreign_key() -> None:
    # Migrations 0017 and 0022: each column starts an index (unique but for
    # task attempts'), which serves the lookups; its own second index only
    # slowed every submission.
    for table, column, unique in COVERED:
        indexed = _indexed(table)
        assert unique in indexed, table
        assert (column,) not in indexed, table


def _plan(sql: str) -> str:
    """The query plan of `sql`, as text."""
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            return " ".join(str(row[-1]) for row in cursor.fetchall())
        # PostgreSQL scans tables this small whatever their indexes; with
        # scans made dear it still takes an index wherever one serves.
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(f"EXPLAIN {sql}")
            return " ".join(str(row[0]) for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")


def test_lookups_by_those_foreign_keys_still_use_an_index() -> None:
    # A user's jobs, a job's tasks and attempts (and the cascades that delete
    # them) must not scan their table.
    for table, column, _ in COVERED:
        plan = _plan(f'SELECT * FROM {table} WHERE "{column}" = 1')
        if connection.vendor == "postgresql":
            assert "Index" in plan and "Seq Scan" not in plan, (table, plan)
        else:
            assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, (table, plan)


def test_one_job_attempts_tasks_are_read_along_their_index() -> None:
    # Migration 0022: a job of 1,000 tasks and 100 retries holds 100,000
    # task attempts; its page and status calls read one attempt's 1,000.
    plan = _plan('SELECT * FROM jobs_taskattempt WHERE "job_id" = 1 AND "number" = 2')
    assert "task_attempt_job_number_idx" in plan, plan
