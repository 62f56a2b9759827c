"""Usage, the dashboard and idle GPUs, from review: edges the first tests
did not reach (jobs/services/usage.py, jobs/services/dashboard.py,
jobs/api/views/usage.py)."""

from __future__ import annotations

import pytest

from jobs.models import TaskUsage
from tests.test_usage import node, running_tasks  # noqa: F401  (fixture)
from tests.test_usage_api import logged_in, v1_url, v2_url


@pytest.mark.parametrize("since", ["9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.9995+00:00"])
def test_since_at_the_last_millisecond_a_time_can_hold_gives_no_samples_not_a_500(alice, node, since):  # noqa: F811
    """The next millisecond after it cannot be held: it was an OverflowError."""
    attempt = running_tasks(alice, node, 1)[0]
    try:
        for url in (v1_url(attempt.job), v2_url(attempt.job)):
            answer = logged_in(alice).get(url, {"since": since})
            assert answer.status_code == 200, answer.content
            body = answer.json()
            assert (body.get("samples") if "samples" in body else body["tasks"][0]["samples"]) == []
    finally:
        TaskUsage.objects.filter(attempt=attempt).delete()
