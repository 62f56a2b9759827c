"""Jobs lose the index Django gave their owner foreign key, and tasks and
job attempts the one on their job: each starts a unique index that serves
every lookup by that column ((owner, name), (job, role, index), (job,
number)): a user's jobs, a job's tasks and attempts, the cascades when a
user or job goes. Each index was one more B-tree to write for every
submitted job, which stores a job, its first attempt and its tasks.

As in 0016: only the indexes go (SQLite would otherwise copy each table to
alter the field); they are found by their columns, as Django named them
after a hash. The foreign keys themselves stay.
"""

from django.db import migrations, models

# (table, column) whose own single-column index goes.
COVERED = [("jobs_job", "owner_id"), ("jobs_task", "job_id"), ("jobs_jobattempt", "job_id")]


def _own_indexes(schema_editor, table: str, column: str) -> list[str]:
    with schema_editor.connection.cursor() as cursor:
        constraints = schema_editor.connection.introspection.get_constraints(cursor, table)
    return [name for name, info in constraints.items()
            if info["index"] and not info["unique"] and not info["primary_key"] and info["columns"] == [column]]


def drop_indexes(apps, schema_editor) -> None:
    for table, column in COVERED:
        for name in _own_indexes(schema_editor, table, column):
            schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


def add_indexes(apps, schema_editor) -> None:
    for table, column in COVERED:
        if not _own_indexes(schema_editor, table, column):
            schema_editor.execute(f"CREATE INDEX {table}_{column}_idx ON {table} ({column})")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0016_logline_attempt_without_own_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="owner",
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.CASCADE, related_name="jobs",
                                            to="jobs.user"),
                ),
                migrations.AlterField(
                    model_name="task",
                    name="job",
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.CASCADE, related_name="tasks",
                                            to="jobs.job"),
                ),
                migrations.AlterField(
                    model_name="jobattempt",
                    name="job",
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.CASCADE,
                                            related_name="attempts", to="jobs.job"),
                ),
            ],
            database_operations=[migrations.RunPython(drop_indexes, add_indexes, elidable=False)],
        ),
    ]
