"""On SQLite, a trigram full-text index of job names for the job list's
search box, kept by triggers.

A search for a part of a name ("bert_12") cannot use an ordinary index: it
read the name of every job the viewer may list, twice per page (the page and
its count), 50 ms of an admin's page at 100,000 jobs in bench/job_list.py.
FTS5's trigram tokenizer finds the names holding a piece of three or more
characters, case-blind, from its index (listing.filtered_jobs; shorter
pieces still read the names). PostgreSQL has its own trigram index
(migration 0008); other databases get nothing.

The table holds no copy of the names (content='jobs_job'): the triggers feed
it each name as a job is stored, renamed or deleted. A later migration that
makes SQLite rebuild jobs_job (most field changes do: a new table is copied
and renamed) drops the triggers with the old table and must create them
again with `create_triggers`; tests/test_listing_sql.py fails until it does.
"""

from django.db import migrations

TABLE = "jobs_job_name_fts"
TRIGGERS = {
    f"{TABLE}_insert": f"""AFTER INSERT ON jobs_job BEGIN
        INSERT INTO {TABLE} (rowid, name) VALUES (new.id, new.name);
    END""",
    f"{TABLE}_delete": f"""AFTER DELETE ON jobs_job BEGIN
        INSERT INTO {TABLE} ({TABLE}, rowid, name) VALUES ('delete', old.id, old.name);
    END""",
    f"{TABLE}_rename": f"""AFTER UPDATE OF name ON jobs_job BEGIN
        INSERT INTO {TABLE} ({TABLE}, rowid, name) VALUES ('delete', old.id, old.name);
        INSERT INTO {TABLE} (rowid, name) VALUES (new.id, new.name);
    END""",
}


def create_triggers(schema_editor) -> None:
    for name, body in TRIGGERS.items():
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
        schema_editor.execute(f"CREATE TRIGGER {name} {body}")


def create(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "sqlite":
        return
    schema_editor.execute(
        f"CREATE VIRTUAL TABLE {TABLE} USING fts5(name, content='jobs_job', content_rowid='id', tokenize='trigram')")
    create_triggers(schema_editor)
    # The jobs stored so far.
    schema_editor.execute(f"INSERT INTO {TABLE} ({TABLE}) VALUES ('rebuild')")


def drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "sqlite":
        return
    for name in TRIGGERS:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
    schema_editor.execute(f"DROP TABLE IF EXISTS {TABLE}")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0014_job_state_vc_recent_index"),
    ]

    operations = [
        migrations.RunPython(create, drop, elidable=False),
    ]
