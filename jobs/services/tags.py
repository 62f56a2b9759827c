"""Tags on jobs: free-form labels their owner adds and removes (REST v2's
PUT and DELETE .../tag), which job lists filter by."""

from __future__ import annotations

import re

from django.db import IntegrityError, transaction

from jobs.models import Job, JobTag
from jobs.services.submission import SubmitError

# Commas separate tags in list filters (tagsContain=a,b); no control characters.
_TAG_RE = re.compile(r"^[^,\x00-\x1f\x7f]+\Z")


def _checked(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SubmitError("InvalidParametersError", 'value must be a non-empty string: {"value": "<tag>"}', "value")
    if len(value) > JobTag.MAX_LENGTH or not _TAG_RE.fullmatch(value):
        raise SubmitError("InvalidParametersError", f"a tag is at most {JobTag.MAX_LENGTH} characters, without "
                                                    "commas or control characters", "value")
    return value


def job_tag_add(*, job: Job, value: object) -> bool:
    """Add a tag (already there: nothing to do). Returns whether it was new."""
    tag = _checked(value)
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).first()  # one writer per job: the count below holds
        if JobTag.objects.filter(job=job, value=tag).exists():
            return False
        if JobTag.objects.filter(job=job).count() >= JobTag.MAX_PER_JOB:
            raise SubmitError("InvalidParametersError", f"a job has at most {JobTag.MAX_PER_JOB} tags", "value")
        try:
            with transaction.atomic():
                JobTag.objects.create(job=job, value=tag)
        except IntegrityError:  # added meanwhile (a database without row locks)
            return False
    return True


def job_tag_remove(*, job: Job, value: object) -> bool:
    """Remove a tag; returns whether the job had it."""
    deleted, _ = JobTag.objects.filter(job=job, value=_checked(value)).delete()
    return bool(deleted)
