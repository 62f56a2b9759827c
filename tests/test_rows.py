"""Rows written without the ORM's save (jobs/services/rows.py) hold what
save() would have written: compared field by field, as the database gives
them back, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

from jobs.models import Job, State, VirtualCluster
from jobs.services import rows


def _job(owner, name: str, **values) -> Job:
    return Job(owner=owner, name=name, virtual_cluster=VirtualCluster.objects.get(name=VirtualCluster.DEFAULT),
               config_raw="{}", config={"jobName": "same", "nested": [1, "two", None]}, **values)


def _stored(job: Job) -> dict:
    fields = [f.attname for f in Job._meta.concrete_fields if f.attname not in ("id", "name")]
    return Job.objects.filter(pk=job.pk).values(*fields).get()


def test_save_new_stores_what_save_stores_for_every_kind_of_value(alice):
    values = {
        "state": State.STOPPED,  # a choices member, a str of its own class
        "retry_limit": True,  # a bool in an integer field: 1
        "exit_code": -3, "total_gpus": 0, "gpu_type": "", "exit_reason": "ünïcode ✓",
        "upload_outputs": True, "warnings": [{"field": "x", "message": "y"}],
        "submitted_at": datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), "started_at": None,
        "stop_requested_by": alice,
    }
    by_orm = _job(alice, "by-orm", **values)
    by_orm.save()
    by_rows = _job(alice, "by-rows", **values)
    rows.save_new([by_rows], unique=("owner_id", "name"))

    assert by_rows.pk is not None and by_rows.pk != by_orm.pk
    assert _stored(by_rows) == _stored(by_orm)
    assert _stored(by_rows)["retry_limit"] == 1 and _stored(by_rows)["state"] == "STOPPED"


def test_save_new_fills_in_the_models_defaults(alice):
    by_orm = _job(alice, "defaults-orm")
    by_orm.save()
    by_rows = _job(alice, "defaults-rows")
    rows.save_new([by_rows], unique=("owner_id", "name"))

    orm, saved = _stored(by_orm), _stored(by_rows)
    # submitted_at defaults to the moment each was made
    assert abs((saved.pop("submitted_at") - orm.pop("submitted_at")).total_seconds()) < 5
    assert saved == orm
