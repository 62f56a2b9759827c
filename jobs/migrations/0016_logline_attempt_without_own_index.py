"""Log lines lose the index Django gave their attempt foreign key: the
unique (attempt, stream, seq) index starts with the same column and serves
every lookup by attempt (the log pages, a search, the cascade when an
attempt goes), and the second index made each stored line a third slower
to insert on SQLite, where a busy task's output is written.

Only the index is dropped (SQLite would otherwise copy the whole table to
alter the field); it is found by its columns, as Django named it after a
hash. The foreign key itself stays.
"""

from django.db import migrations, models


def _attempt_only_indexes(schema_editor) -> list[str]:
    with schema_editor.connection.cursor() as cursor:
        constraints = schema_editor.connection.introspection.get_constraints(cursor, "jobs_logline")
    return [name for name, info in constraints.items()
            if info["index"] and not info["unique"] and not info["primary_key"] and info["columns"] == ["attempt_id"]]


def drop_index(apps, schema_editor) -> None:
    for name in _attempt_only_indexes(schema_editor):
        schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


def add_index(apps, schema_editor) -> None:
    if not _attempt_only_indexes(schema_editor):
        schema_editor.execute("CREATE INDEX jobs_logline_attempt_id_idx ON jobs_logline (attempt_id)")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0015_job_name_trigram_sqlite"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="logline",
                    name="attempt",
                    field=models.ForeignKey(db_index=False, on_delete=models.deletion.CASCADE, related_name="log_lines",
                                            to="jobs.taskattempt"),
                ),
            ],
            database_operations=[migrations.RunPython(drop_index, add_index, elidable=False)],
        ),
    ]
