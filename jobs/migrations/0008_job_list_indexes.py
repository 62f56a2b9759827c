"""Indexes for the job list at a million jobs (bench/job_list.py).

- The list's orders with their id tie-breakers, so PostgreSQL reads a deep
  page from the index alone (an index on submitted_at only made it fetch
  every skipped row from the table to learn its id).
- On PostgreSQL only, for the sort by duration (listing._ids_by_run_time):
  finished jobs' run time (it never changes) and running jobs' start.
- On PostgreSQL only, a trigram index (pg_trgm, a trusted extension) on the
  upper-cased name, which Django's `icontains` compares: the search box no
  longer reads every row. A database user that may not create the extension
  keeps the slower search; the migration says so and goes on.
"""

from django.db import migrations, models, transaction

TRIGRAM_INDEX = 'CREATE INDEX IF NOT EXISTS job_name_trgm_idx ON jobs_job USING gin ((UPPER("name"::text)) gin_trgm_ops)'
# listing.FinishedRunSeconds must stay this very expression.
RUN_TIME_INDEXES = [
    "CREATE INDEX IF NOT EXISTS job_run_time_idx ON jobs_job ((EXTRACT(EPOCH FROM (finished_at - started_at))), id) "
    "WHERE finished_at IS NOT NULL AND started_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS job_running_since_idx ON jobs_job (started_at, id) "
    "WHERE finished_at IS NULL AND started_at IS NOT NULL",
]


def add_postgres_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for statement in RUN_TIME_INDEXES:
        schema_editor.execute(statement)
    try:
        with transaction.atomic(using=schema_editor.connection.alias):  # a savepoint: a refusal rolls back only this
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            schema_editor.execute(TRIGRAM_INDEX)
    except Exception as exc:  # noqa: BLE001 -- the portal works without it, only searches slower
        print(f"\n  job search index skipped (pg_trgm not available to this database user: {exc})")


def drop_postgres_indexes(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for name in ("job_name_trgm_idx", "job_run_time_idx", "job_running_since_idx"):
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0007_task_usage"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="job", name="job_owner_recent_idx"),
        migrations.RemoveIndex(model_name="job", name="job_recent_idx"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["owner", "-submitted_at", "id"], name="job_owner_recent_idx"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["-submitted_at", "id"], name="job_recent_idx"),
        ),
        migrations.AddIndex(model_name="job", index=models.Index(fields=["name", "id"], name="job_name_sort_idx")),
        migrations.AddIndex(model_name="job", index=models.Index(fields=["total_gpus", "id"], name="job_gpus_sort_idx")),
        migrations.AddIndex(model_name="job", index=models.Index(fields=["total_tasks", "id"], name="job_tasks_sort_idx")),
        migrations.AddIndex(
            model_name="job", index=models.Index(fields=["attempt_number", "id"], name="job_retries_sort_idx"),
        ),
        migrations.RunPython(add_postgres_indexes, drop_postgres_indexes),
    ]
