"""Timestamps as whole seconds since 1970, in SQL for SQLite and
PostgreSQL: Django has none portable, and its Trunc* functions call back
into Python for every row on SQLite. The admin dashboard counts its buckets
with it (services/dashboard.py), the job-wide usage summary its own
(services/usage_series.py)."""

from __future__ import annotations

from typing import Any

from django.db import NotSupportedError
from django.db.models import BigIntegerField, Func


def epoch_seconds_sql(at: str, vendor: str, *, up: bool = False) -> str:
    """The SQL of `at` (a timestamp column or expression) as whole seconds
    since 1970, rounded up (`up`) or down. Rounded up on SQLite, `at`
    appears twice: its parameters are needed twice."""
    if vendor == "postgresql":
        rounding = "CEIL" if up else "FLOOR"  # EXTRACT(EPOCH) is an exact numeric (PostgreSQL 14+)
        return f"CAST({rounding}(EXTRACT(EPOCH FROM {at})) AS BIGINT)"
    if vendor == "sqlite":
        # Django stores 'YYYY-MM-DD HH:MM:SS[.ffffff]' in UTC. The fraction is
        # cut off as text: strftime() reads it to the millisecond, rounded,
        # so 09:59:59.9999 would be 10:00:00.
        seconds = f"CAST(strftime('%%s', substr({at}, 1, 19)) AS INTEGER)"
        return f"({seconds} + (CAST(substr({at}, 21) AS INTEGER) > 0))" if up else seconds
    raise NotSupportedError(f"epoch seconds are written for SQLite and PostgreSQL, not {vendor}")


class EpochSeconds(Func):
    """epoch_seconds_sql as an expression. Bucket starts are whole seconds,
    so a timestamp rounded up is after a bucket's start exactly when the
    timestamp itself is."""

    output_field = BigIntegerField()

    def __init__(self, expression: Any, *, up: bool) -> None:
        super().__init__(expression)
        self.up = up

    def as_sql(self, compiler, connection, **extra):
        at, params = compiler.compile(self.source_expressions[0])
        twice = self.up and connection.vendor == "sqlite"
        return epoch_seconds_sql(at, connection.vendor, up=self.up), [*params, *params] if twice else params
