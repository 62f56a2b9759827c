"""Writing rows without bulk_create: the scheduling pass's thousands of
allocations, and a submission's job, attempt and tasks.

bulk_create builds a query and compiles it per call, and an instance per
row; where the rows are plain and many (bench/scheduler_scale.py), or
written on every submission (bench/api_submit_rate.py), that costs more
than the writing itself. These take values by field attname and fill in
the model's defaults, so the model stays the one place that says what a
new row holds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, models


def insert(model: type[models.Model], rows: list[dict[str, Any]]) -> None:
    """INSERT `rows` (values by field attname, the same fields in each) into
    `model`'s table (`insert_values`); the fields they leave out get their
    defaults, as a new instance would. What bulk_create does, without an
    instance per row (a pass may create thousands: bench/scheduler_scale.py)."""
    if not rows:
        return
    plan = _insert_plan(model, tuple(rows[0]), connection.vendor)
    template = plan.template.copy()
    for i, field in plan.made_per_call:  # timezone.now, dict ...: one value for all rows, as a new instance's
        template[i] = field.get_db_prep_save(field.get_default(), connection)
    params = []
    last: dict[str, tuple[Any, Any]] = {}  # per field: the last value and what it became (one `now` for all rows)
    for row in rows:
        values = template.copy()
        for i, name, field in plan.given_at:
            value = row[name]
            if field is None:
                values[i] = value
            elif isinstance(field, models.JSONField):
                values[i] = None if value is None else json.dumps(value, cls=field.encoder)
            else:
                seen = last.get(name)
                if seen is None or seen[0] is not value:
                    seen = last[name] = (value, field.get_db_prep_save(value, connection))
                values[i] = seen[1]
        params.append(values)
    insert_values(model, plan.names, params)


@dataclass(frozen=True)
class _InsertPlan:
    names: list[str]  # every field the INSERT names (attnames), in order
    template: list[Any]  # a row with the defaults that are the same every time; None where given or made per call
    made_per_call: list[tuple[int, models.Field]]  # defaults made by a callable (a time, a new dict)
    given_at: list[tuple[int, str, models.Field | None]]  # given fields; with the field if its value needs preparing


@functools.lru_cache(maxsize=64)
def _insert_plan(model: type[models.Model], given: tuple[str, ...], vendor: str) -> _InsertPlan:
    """What `insert` works out once per model and set of given fields, not
    per call (for a submission's attempt and task that was half of their
    INSERTs' CPU): the names, the defaults that never change, prepared for
    the database once, and which values need preparing. `vendor` keys it to
    the database the preparation was done for."""
    fields = [field for field in model._meta.concrete_fields if not field.primary_key]
    defaulted = [(i, field) for i, field in enumerate(fields) if field.attname not in given]
    template: list[Any] = [None] * len(fields)
    made_per_call = []
    for i, field in defaulted:
        if callable(field.default):
            made_per_call.append((i, field))
        else:
            template[i] = field.get_db_prep_save(field.get_default(), connection)
    # Plain numbers and text go to the driver as they are; JSON becomes its
    # text (what SQLite stores and COPY reads), times what this database stores.
    given_at = [(i, field.attname, field if field.get_internal_type() in ("JSONField", "DateTimeField", "DateField")
                 else None) for i, field in enumerate(fields) if field.attname in given]
    return _InsertPlan([field.attname for field in fields], template, made_per_call, given_at)


# Fewer rows than this are INSERTed on PostgreSQL too.
COPY_MIN_ROWS = 20


def insert_values(model: type[models.Model], names: list[str], rows: list[Sequence[Any]]) -> None:
    """INSERT `rows`, each the values of the fields `names` (attnames), into
    `model`'s table: by COPY on PostgreSQL, by one executemany on SQLite
    (which runs it in one call). For thousands of rows COPY took a third of
    the time of executemany, whose every row psycopg sends as a statement
    of its own (bench/scheduler_scale.py). A few rows (a submission's
    tasks) go as INSERTs there too: COPY costs a round trip more."""
    if not rows:
        return
    table, columns = _table_and_columns(model, tuple(names), connection.vendor)
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql" or len(rows) < COPY_MIN_ROWS:
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(names))})", rows)
            return
        # COPY is psycopg's own: through Django's error wrapper, so that a
        # duplicate allocation is an IntegrityError as from any statement.
        with connection.wrap_database_errors, cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


@functools.lru_cache(maxsize=64)
def _table_and_columns(model: type[models.Model], names: tuple[str, ...], vendor: str) -> tuple[str, str]:
    """`model`'s table and the columns of the fields `names`, quoted for
    the database `vendor` names; worked out once, not per INSERT."""
    quote = connection.ops.quote_name
    return quote(model._meta.db_table), ", ".join(quote(model._meta.get_field(name).column) for name in names)


def many(model: type[models.Model], sql: str, rows: list[tuple]) -> None:
    """One statement run for many rows: `sql` names `model`'s table and
    columns as {table} and {<field attname>}. For the plain rows a pass
    writes by the thousand, where building and saving a model instance per
    row cost more than the writing itself (bench/scheduler_scale.py)."""
    if not rows:
        return
    with connection.cursor() as cursor:
        cursor.executemany(sql_for(model, sql), rows)


def sql_for(model: type[models.Model], sql: str, **extra: str) -> str:
    """`sql` with {table} and {<field attname>} replaced by `model`'s
    quoted table and column names (and `extra` as given)."""
    quote = connection.ops.quote_name
    names = {field.attname: quote(field.column) for field in model._meta.concrete_fields}
    return sql.format(table=quote(model._meta.db_table), **names, **extra)


def save_new(objs: Sequence[models.Model], *, unique: tuple[str, ...]) -> None:
    """INSERT new instances of one model, a statement per SAVE_NEW_BATCH of
    them, and give them their ids: what bulk_create does, without compiling
    a query per call (for the few jobs of a submission's write, with a
    job's 28 fields, that was a seventh of a submission's CPU:
    bench/api_submit_rate.py). Values
    go through each field's own pre_save and database preparation, as
    save() sends them. RETURNING promises no order, so each row comes back
    with `unique`, fields (attnames) that no two of `objs` share."""
    for start in range(0, len(objs), SAVE_NEW_BATCH):
        _save_new(objs[start:start + SAVE_NEW_BATCH], unique)


# Rows per statement: a statement's parameters are bounded (SQLite 32,766, PostgreSQL 65,535).
SAVE_NEW_BATCH = 500


# Fields whose value goes to the database as it is when it already has the
# Python type the field stores: what their pre_save and database preparation
# return for such a value, without the call chain (per field and row: for a
# job's 31 fields that chain was a tenth of a submission's CPU).
_PLAIN_TYPES: dict[type[models.Field], type] = {
    models.CharField: str, models.TextField: str, models.BooleanField: bool,
    models.IntegerField: int, models.PositiveIntegerField: int, models.BigIntegerField: int,
}


def _plain_type(field: models.Field) -> type | None:
    """The Python type `field` stores unchanged, or None if its own
    preparation must run (times, JSON, defaults made at save ...). Exact
    classes only: a subclass may prepare values its own way."""
    if isinstance(field, models.ForeignKey):
        return _plain_type(field.target_field) if type(field) is models.ForeignKey else None
    return _PLAIN_TYPES.get(type(field))


@functools.cache
def _new_row_fields(model: type[models.Model]) -> list[tuple[models.Field, type | None]]:
    """The fields an INSERT of `model` names, each with its `_plain_type`."""
    return [(field, _plain_type(field)) for field in model._meta.concrete_fields if not field.primary_key]


def _db_value(field: models.Field, plain: type | None, obj: models.Model) -> Any:
    if plain is not None:
        value = getattr(obj, field.attname)
        # Exactly that type: True in an integer field goes the long way (it stores 1).
        if value is None or type(value) is plain:
            return value
    return field.get_db_prep_save(field.pre_save(obj, True), connection)


def _save_new(objs: Sequence[models.Model], unique: tuple[str, ...]) -> None:
    model = type(objs[0])
    fields = _new_row_fields(model)
    values = [_db_value(field, plain, obj) for obj in objs for field, plain in fields]
    with connection.cursor() as cursor:
        cursor.execute(_save_new_sql(model, len(objs), unique, connection.vendor), values)
        ids = {tuple(found[1:]): found[0] for found in cursor.fetchall()}
    for obj in objs:
        obj.pk = ids[tuple(getattr(obj, name) for name in unique)]
        obj._state.adding = False
        obj._state.db = connection.alias


@functools.lru_cache(maxsize=64)
def _save_new_sql(model: type[models.Model], count: int, unique: tuple[str, ...], vendor: str) -> str:
    """The INSERT of `count` new rows of `model`, made once: per submission
    its quoting and joining cost more than SQLite took to run it. A few
    sizes of batch recur (one or a few jobs); `vendor` keys the quoting."""
    quote = connection.ops.quote_name
    fields = _new_row_fields(model)
    returning = [model._meta.pk, *(model._meta.get_field(name) for name in unique)]
    row = f"({', '.join(['%s'] * len(fields))})"
    return (f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(field.column) for field, _ in fields)}) "
            f"VALUES {', '.join([row] * count)} RETURNING {', '.join(quote(field.column) for field in returning)}")
