"""On PostgreSQL, leave a quarter of each page of the jobs table free.

A scheduling pass rewrites the waiting reason of thousands of waiting jobs
at once (jobs/services/scheduling.py), and the pages and the API touch other
unindexed columns of running jobs. With room left on the row's own page,
PostgreSQL updates such a row in place (a "HOT" update) instead of writing a
new entry into every one of the table's fifteen indexes: in
bench/scheduler_scale.py that rewrite took half the time. Only pages written
from now on keep the room; a `VACUUM FULL jobs_job` in a quiet hour applies it
to an existing table. SQLite has no such setting.
"""

from django.db import migrations


def set_fillfactor(apps, schema_editor, value: int = 75) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE jobs_job SET (fillfactor = {int(value)})")


def reset_fillfactor(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_job RESET (fillfactor)")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0010_image_pulls"),
    ]

    operations = [
        migrations.RunPython(set_fillfactor, reset_fillfactor, elidable=False),
    ]
