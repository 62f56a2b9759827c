"""Timestamps as whole seconds since 1970, in SQL for SQLite and
PostgreSQL: Django has none portable, and its Trunc* functions call back
into Python for every row on SQLite. The admin dashboard counts its buckets
with it (services/dashboard.py), the job-wide usage summary its own
(services/usage_series.py).

And the database server's clock (`database_now`), which node heartbeats
are stamped and judged by."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import NotSupportedError, connection
from django.db.models import BigIntegerField, Func
from django.utils import timezone


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


def database_now() -> datetime:
    """The database server's clock, which every process of the portal
    shares, where a host's own clock may be off by any amount.

    Heartbeats are stamped and judged with it: a node agent stamped its
    node's heartbeat and declared other nodes lost by its own clock, so one
    node whose clock ran NODE_LOST_AFTER_SECONDS ahead would have declared
    every other node lost and failed their tasks, and one that far behind
    would have been declared lost at every check. On SQLite the database
    is a library in this process and its clock is this host's, as is every
    process's that can open the file."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")  # not now(): a transaction's start
            return cursor.fetchone()[0]
    return timezone.now()
