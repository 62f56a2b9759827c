"""Accepting a job: parse, check, store, and wake the scheduler."""

from __future__ import annotations

import copy
import dataclasses

from django.conf import settings

from jobs import keys, storage
from jobs.models import Job, User, VirtualCluster
from jobs.services import job_store, limits, permissions_memo
from jobs.services.admission import admission_problems
from jobs.spec import JobSpec, ParsedConfig, SpecError, SpecProblem, parse_config_text


class SubmitError(Exception):
    """A config that parses but cannot be accepted. `code` follows OpenPAI's
    REST error names; `field` names the config field at fault."""

    def __init__(self, code: str, message: str, field: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


def parse_for_user(data: str | bytes, *, user: User) -> ParsedConfig:
    return parse_config_text(data, user_name=user.username, default_fs_uri=settings.PAI_DEFAULT_FS_URI)


def virtual_cluster_for(user: User, name: str) -> VirtualCluster:
    """The virtual cluster `name` if `user` may submit to it; else SubmitError
    (Submit Job's live check shows the same message). A yes is remembered
    until permissions change (a sweep asks it for every job); a no is not."""
    vc = permissions_memo.remembered(("vc", user.pk, name), lambda: _virtual_cluster_allowed(user, name))
    return copy.copy(vc)  # the caller's own: it becomes a job's related object


def _virtual_cluster_allowed(user: User, name: str) -> VirtualCluster:
    try:
        vc = VirtualCluster.objects.get(name=name)
    except VirtualCluster.DoesNotExist:
        names = ", ".join(vc.name for vc in VirtualCluster.objects.usable_by(user)) or "none"
        raise SubmitError("NoVirtualClusterError", f'virtual cluster "{name}" does not exist; yours: {names}', "virtualCluster") from None
    if not vc.allows(user):
        raise SubmitError("ForbiddenUserError", f'you may not submit to virtual cluster "{name}"', "virtualCluster")
    return vc


def _check_waiting_limit(owner: User, vc: VirtualCluster) -> None:
    problem = limits.waiting_limit_problem(user=owner, vc=vc)
    if problem:
        raise SubmitError("NoEnoughQuotaError", problem, "virtualCluster")


def _check_admission(spec: JobSpec) -> None:
    problems = admission_problems(spec)
    if problems:
        raise SpecError(problems)


def _check_storage(user: User, spec: JobSpec) -> None:
    """Only looks: the node makes outputDir as the job's tasks start."""
    problems = storage.check_job_paths(user_name=user.username, is_admin=user.is_admin, spec=spec)
    if problems:
        raise SpecError([SpecProblem(field, message) for field, message in problems])


def _with_full_uris(spec: JobSpec, user: User) -> JobSpec:
    """The job's folders as full URIs ("code" -> "file:///alice/code"), so the
    node, the task's PAI_*_DIR variables, the page and the API all see the
    same, unambiguous place. The config as submitted keeps what was typed."""
    def full(value: str | None) -> str | None:
        return storage.canonical_uri(value, user_name=user.username) if value else value

    return dataclasses.replace(spec, code_dir=full(spec.code_dir), data_dir=full(spec.data_dir),
                               output_dir=full(spec.output_dir), auth_file=full(spec.auth_file))


def _upload_outputs_wanted(spec: JobSpec, asked: bool | None) -> bool:
    """Per job (`extras.uploadOutputs: true`, or the caller), else the admin's default."""
    if asked is not None:
        return asked
    wanted = spec.extras.get("uploadOutputs")
    return wanted if isinstance(wanted, bool) else settings.UPLOAD_OUTPUTS_DEFAULT


def job_submit(*, owner: User, config: str | bytes | ParsedConfig, upload_outputs: bool | None = None) -> Job:
    """Validate a v1 config and queue the job. Raises SpecError or SubmitError."""
    with job_store.submitting():
        return _submit(owner, config, upload_outputs)


def _submit(owner: User, config: str | bytes | ParsedConfig, upload_outputs: bool | None) -> Job:
    parsed = config if isinstance(config, ParsedConfig) else parse_for_user(config, user=owner)
    spec = parsed.spec
    vc = virtual_cluster_for(owner, spec.virtual_cluster)
    # The waiting limit is checked first, so a refused job costs nothing (no
    # output folder), and again as the job is stored (a concurrent
    # submission may take the last place meanwhile).
    _check_waiting_limit(owner, vc)
    # A taken name is found by the unique constraint when the job is stored
    # (a query here could not close the race with a concurrent submission).
    _check_admission(spec)
    _check_storage(owner, spec)
    spec = _with_full_uris(spec, owner)
    job = Job(
        owner=owner, name=spec.job_name, virtual_cluster=vc, config_raw=parsed.raw,
        config=spec.to_config(), warnings=[w.as_dict() for w in parsed.warnings],
        retry_limit=spec.retry_count, total_tasks=spec.total_tasks, total_gpus=spec.total_gpus,
        total_roles=len(spec.task_roles), gpu_type=spec.gpu_type or "",
        secrets_sealed=keys.seal_secrets(parsed.secrets),  # the SSH key pair comes at launch (ensure_job_key_pair)
        upload_outputs=_upload_outputs_wanted(spec, upload_outputs),
        waiting_reason="waiting for the scheduler",
    )
    roles = [(role.name, role.task_number) for role in spec.task_roles]
    try:
        return job_store.store(job, roles=roles, max_waiting=limits.limits_for(user=owner, vc=vc).max_waiting_jobs)
    except job_store.NameTaken:
        raise SubmitError("ConflictJobError", f'you already have a job named "{spec.job_name}"', "jobName") from None
    except job_store.OwnerGone:
        raise SubmitError("NoUserError", f"user {owner.username} was removed while the job was being stored",
                          "jobName") from None
    except job_store.VirtualClusterGone:
        raise SubmitError("NoVirtualClusterError", f'virtual cluster "{vc.name}" was removed while the job was '
                                                   "being stored", "virtualCluster") from None
    except job_store.WaitingLimitReached as exc:
        words = limits.waiting_limit_words(waiting=exc.waiting, limit=exc.limit, vc_name=vc.name)
        raise SubmitError("NoEnoughQuotaError", words, "virtualCluster") from None


def suggest_job_name(owner: User, base: str) -> str:
    """`base` if free, else base_2, base_3 ... (for Clone and the form)."""
    base = base[:100] or "job"
    taken = set(Job.objects.filter(owner=owner, name__startswith=base).values_list("name", flat=True))
    if base not in taken:
        return base
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    return f"{base}_{number}"


