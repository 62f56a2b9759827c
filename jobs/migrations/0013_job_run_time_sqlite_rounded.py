"""On SQLite, the finished jobs' run-time indexes of migration 0012 again,
on the run time rounded to the millisecond.

A difference of two julianday values is off by some 20 microseconds, and
by a different amount for different dates: two jobs that ran exactly as
long compared unequal for about one start time in thirteen, and the list
sorted by duration then broke their tie by that error instead of by id
(tests/test_job_list_duration_sqlite.py failed now and then).
listing.FinishedRunSeconds now rounds, and SQLite uses an index only for
its very expression.
"""

from django.db import migrations

FINISHED = "WHERE finished_at IS NOT NULL AND started_at IS NOT NULL"
# listing.FinishedRunSeconds' SQLite form, exactly; 0012's without ROUND.
RUN_TIME = "ROUND((julianday(finished_at) - julianday(started_at)) * 86400.0, 3)"
OLD_RUN_TIME = "((julianday(finished_at) - julianday(started_at)) * 86400.0)"


def _definitions(run_time: str) -> dict[str, str]:
    return {
        "job_run_time_sqlite_idx": f"(({run_time}), id, finished_at, started_at) {FINISHED}",
        "job_owner_run_time_sqlite_idx": f"(owner_id, ({run_time}), id, finished_at, started_at) {FINISHED}",
    }


def _remake(schema_editor, run_time: str) -> None:
    if schema_editor.connection.vendor == "sqlite":
        for name, definition in _definitions(run_time).items():
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")
            schema_editor.execute(f"CREATE INDEX {name} ON jobs_job {definition}")


def rounded(apps, schema_editor) -> None:
    _remake(schema_editor, RUN_TIME)


def unrounded(apps, schema_editor) -> None:
    _remake(schema_editor, OLD_RUN_TIME)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0012_job_run_time_sqlite_indexes"),
    ]

    operations = [
        migrations.RunPython(rounded, unrounded, elidable=False),
    ]
