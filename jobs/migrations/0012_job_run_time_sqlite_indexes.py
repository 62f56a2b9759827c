"""On SQLite, indexes for the job list sorted by duration (run time).

listing._ids_by_run_time_sqlite merges three streams that these give in
order, so a page no longer computes and sorts the run time of every job (a
third of a second at 100,000 jobs in bench/job_list.py):

- finished jobs by their run time, which never changes; the expression was
  listing.FinishedRunSeconds' SQLite form, or SQLite would not use it
  (migration 0013 remade both on the run time rounded to the millisecond).
  finished_at and started_at ride along so that the run time comes from the
  index alone, without a read of each (wide) row of a deep page;
- running jobs by start (their run time grows with 'now'), ties by id
  descending, so one index gives both directions;
- jobs never started, by id.

Each also per owner (owner_id first), for a user's own list: without them a
heavy user's 30,000 jobs were sorted on every page.

PostgreSQL has its own (migration 0008); other databases get nothing.
"""

from django.db import migrations

FINISHED = "WHERE finished_at IS NOT NULL AND started_at IS NOT NULL"
RUNNING = "WHERE finished_at IS NULL AND started_at IS NOT NULL"
NEVER_STARTED = "WHERE started_at IS NULL"
# listing.FinishedRunSeconds' SQLite form at the time (0013 rounds it).
RUN_TIME = "((julianday(finished_at) - julianday(started_at)) * 86400.0)"
SQLITE_INDEXES = {
    "job_run_time_sqlite_idx": f"(({RUN_TIME}), id, finished_at, started_at) {FINISHED}",
    "job_running_since_sqlite_idx": f"(julianday(started_at), id DESC, started_at, finished_at) {RUNNING}",
    "job_never_started_sqlite_idx": f"(id) {NEVER_STARTED}",
    "job_owner_run_time_sqlite_idx": f"(owner_id, ({RUN_TIME}), id, finished_at, started_at) {FINISHED}",
    "job_owner_running_since_sqlite_idx": f"(owner_id, julianday(started_at), id DESC, started_at, finished_at) {RUNNING}",
    "job_owner_never_started_sqlite_idx": f"(owner_id, id) {NEVER_STARTED}",
}


def add_sqlite_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "sqlite":
        for name, definition in SQLITE_INDEXES.items():
            schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON jobs_job {definition}")


def drop_sqlite_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "sqlite":
        for name in SQLITE_INDEXES:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0011_job_table_fillfactor"),
    ]

    operations = [
        migrations.RunPython(add_sqlite_indexes, drop_sqlite_indexes, elidable=False),
    ]
