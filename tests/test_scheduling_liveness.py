"""No waiting job depends on one wake-up message arriving: a wake-up lost
on purpose (the scheduler's queue emptied with its request flag left set,
as when an agent stops holding a request, or Redis drops it) is repaired by
the node agents' heartbeats within SCHEDULE_REPAIR_SECONDS plus one
heartbeat (2 s and 1 s in the tests' settings)."""

from __future__ import annotations

import pytest
from django.conf import settings
from rq import Queue

from jobs import queues
from jobs.models import ExitType, State
from tests.helpers import config, role, submit, wait_state

pytestmark = pytest.mark.services


def _drop_every_wakeup() -> None:
    """Empty the scheduler's queue and leave the request flag set: any
    request made now is silenced, as if a pass request had been lost."""
    Queue(queues.scheduler_queue_name(), connection=queues.connection()).empty()
    queues.connection().set(f"{settings.PAI_INSTANCE}:schedule-requested", "1", ex=60)


def test_it_starts_a_job_whose_wakeup_was_lost(alice, cluster):
    _drop_every_wakeup()
    job = submit(alice, config("lostwakeup", role(command="true")))
    # Within 30 s: long before the silencing flag (60 s) would run out, so
    # only the repair can have started it.
    assert wait_state(job, State.SUCCEEDED, timeout=30).exit_type == ExitType.SUCCEEDED
