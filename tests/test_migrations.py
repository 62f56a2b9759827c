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


def test_log_lines_are_indexed_once_by_attempt() -> None:
    # Migration 0016: the unique (attempt, stream, seq) index serves lookups
    # by attempt; no second index on the attempt alone slows every insert.
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "jobs_logline")
    indexed = sorted(tuple(info["columns"]) for info in constraints.values() if info["index"] or info["unique"])
    assert ("attempt_id", "stream", "seq") in indexed
    assert ("attempt_id",) not in indexed
