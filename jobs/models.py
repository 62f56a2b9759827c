"""The portal's data: users, virtual clusters, nodes, jobs, tasks, logs.

State lives here, not in Redis: Redis only carries wake-ups and launch
requests, and everything it holds can be rebuilt from these tables.
State changes go through jobs/services.py with conditional UPDATEs.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

from jobs.spec import GPU_TYPE_RE, MAX_GPU_TYPE_LENGTH, JobSpec


class UsernameValidator(RegexValidator):
    """OpenPAI's rule: letters, digits and underscore."""

    regex = r"^[A-Za-z0-9_]+\Z"
    message = "Enter a username of letters, digits and underscores only."
    flags = 0


class User(AbstractUser):
    username_validator = UsernameValidator()
    username = models.CharField(
        "username",
        max_length=64,
        unique=True,
        help_text="Letters, digits and underscores only.",
        validators=[username_validator],
        error_messages={"unique": "A user with that username already exists."},
    )

    class Meta(AbstractUser.Meta):
        permissions = [("administer_portal", "Can administer the portal: every job, node, virtual cluster and user")]
        constraints = [
            # Names are unique whatever their case, as OpenPAI's are: two
            # accounts "alice" and "Alice" would share one login throttle and
            # look alike in every list. In the database, so that two
            # requests at once cannot both pass a check made before the
            # INSERT (PUT /user, the command line, the Django admin).
            models.UniqueConstraint(
                Lower("username"), name="jobs_user_username_any_case",
                violation_error_message="A user with that username already exists (in another case).",
            ),
        ]

    @property
    def is_admin(self) -> bool:
        """A portal admin: a superuser, or a user given the explicit
        `jobs.administer_portal` permission (directly or through a group).
        `is_staff` alone only opens the Django admin to the models it is
        given permissions on; it is no portal right by itself."""
        if not self.is_active:
            return False
        return self.is_superuser or self.has_perm("jobs.administer_portal")


def lock_user_row(user_id: int) -> str | None:
    """Lock a user's row until the transaction ends, so that the user's
    concurrent requests that count or change what they hold (tokens, keys,
    terminals, a password change, the user's deletion) take turns (a row
    lock on PostgreSQL; SQLite's IMMEDIATE transactions are serial anyway).
    Returns the stored password hash, or None when the user is gone."""
    return User.objects.select_for_update().filter(pk=user_id).values_list("password", flat=True).first()


vc_name_validator = RegexValidator(r"^[A-Za-z0-9_]+\Z", "Letters, digits and underscores only.")
node_name_validator = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9\-_.]*\Z", "Letters, digits, - _ and . only.")


class VirtualClusterQuerySet(models.QuerySet):
    def usable_by(self, user: User) -> "VirtualClusterQuerySet":
        """The virtual clusters `user` may submit to (as `allows`, in one query)."""
        if user.is_admin:
            return self
        return self.filter(Q(open_to_all=True) | Q(users=user)).distinct()

    def names_usable_by_each(self, users: list[User]) -> dict[int, list[str]]:
        """`usable_by` for many users at once, as names by user id: one query
        here for any number of users, who come with their virtual_clusters
        prefetched (the admin's user list)."""
        every = list(self.values_list("name", "open_to_all"))
        open_to_all = {name for name, is_open in every if is_open}
        return {u.pk: [name for name, _ in every] if u.is_admin
                else sorted(open_to_all | {vc.name for vc in u.virtual_clusters.all()}) for u in users}


class VirtualCluster(models.Model):
    """A share of the cluster (OpenPAI's virtualCluster).

    `capacity` is a percentage of the cluster's CPUs, memory and GPUs of each
    type; "default" always exists and gets whatever the others leave.
    """

    DEFAULT = "default"

    name = models.CharField(max_length=64, unique=True, validators=[vc_name_validator])
    description = models.TextField(blank=True)
    capacity = models.FloatField(
        default=0.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="Percent of the cluster's resources. Ignored for 'default', which gets the rest.",
    )
    open_to_all = models.BooleanField(default=False, help_text="Every user may submit here.")
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="virtual_clusters")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = VirtualClusterQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The shares are of one cluster: past 100 % together, each would
        be promised what another holds, and the scheduler could keep none
        of the promises ("default"'s is what the others leave)."""
        if self.name == self.DEFAULT or self.capacity is None:
            return
        others = VirtualCluster.objects.exclude(name=self.DEFAULT).exclude(pk=self.pk)
        taken = sum(others.values_list("capacity", flat=True))
        if taken + self.capacity > 100.0:
            raise ValidationError({"capacity": f"The other virtual clusters hold {taken:g} % of the cluster; "
                                               f"at most {max(0.0, 100.0 - taken):g} % is left."})

    def allows(self, user: User) -> bool:
        if self.open_to_all or user.is_admin:
            return True
        return self.users.filter(pk=user.pk).exists()


class UserLimit(models.Model):
    """How much one user may have at once in a virtual cluster: waiting
    jobs (more are refused at submission), running jobs and GPUs in use
    (a job over either waits, and its page says why). Blank: no limit.

    A row without a user is the virtual cluster's default for every user; a
    user's own row replaces it whole (blank there means no limit for them)."""

    virtual_cluster = models.ForeignKey(VirtualCluster, on_delete=models.CASCADE, related_name="user_limits")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="limits", help_text="Leave empty for every user of the virtual cluster.")
    max_waiting_jobs = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: no limit.")
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: no limit.")
    max_gpus = models.PositiveIntegerField("max GPUs in use", null=True, blank=True, help_text="Blank: no limit.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["virtual_cluster", "user"], name="user_limit_unique"),
            models.UniqueConstraint(fields=["virtual_cluster"], condition=Q(user__isnull=True),
                                    name="user_limit_default_unique"),
        ]
        ordering = ["virtual_cluster__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user or 'every user'} in {self.virtual_cluster}"


# A node's GPUs as its agent registers them (node_agent: detect_gpus, --gpus).
# Every reader of Node.gpus (the scheduler, the Nodes, Submit and admin
# pages, metrics) takes this shape for granted, so an admin's edit must keep it.
GPUS_EXAMPLE = '[{"index": 0, "type": "V100"}, {"index": 1, "type": "V100"}]'
GPU_KEYS = frozenset({"index", "type"})
# The host ports a node may give tasks, as node_agent --ports takes them.
NODE_PORTS = (1024, 65535)


def _shown_json(value: object) -> str:
    return json.dumps(value)[:80]


def _gpu_problem(gpu: object, seen: set[int]) -> str | None:
    """What is wrong with one entry of Node.gpus, or None."""
    if not isinstance(gpu, dict) or set(gpu) != GPU_KEYS:
        return f'expected {{"index": <number>, "type": "<GPU type>"}} with just those keys, not {_shown_json(gpu)}'
    index, kind = gpu["index"], gpu["type"]
    # bool is an int to Python, but true/false is no GPU number.
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return f'"index" must be the GPU\'s number on the node (0, 1, ...), not {_shown_json(index)}'
    if index in seen:
        return f'"index" {index} is listed twice; each GPU goes in once'
    # A type no job's gpuType could name would be a GPU nobody can use.
    if not isinstance(kind, str) or not GPU_TYPE_RE.match(kind) or len(kind) > MAX_GPU_TYPE_LENGTH:
        return (f'"type" must be a GPU type as a job\'s gpuType names it (1 to 64 letters, digits, - . _; '
                f"e.g. V100), not {_shown_json(kind)}")
    return None


def validate_node_gpus(gpus: object) -> None:
    """Raises ValidationError unless `gpus` has the shape a node agent
    registers: a list of {"index": n, "type": "V100"}, each index once.
    Its code is its own: a ModelForm puts its field's message in place of
    a model error whose code the field knows ("invalid": "Enter a valid JSON.")."""
    if not isinstance(gpus, list):
        raise ValidationError(f"gpus must be a list of GPUs such as {GPUS_EXAMPLE} (or [] for none), "
                              f"not {_shown_json(gpus)}", code="gpus_shape")
    seen: set[int] = set()
    for number, gpu in enumerate(gpus, start=1):
        problem = _gpu_problem(gpu, seen)
        if problem:
            raise ValidationError(f"gpus, GPU {number} of the list: {problem}", code="gpus_shape")
        seen.add(gpu["index"])


def node_port_range_errors(port_start: int | None, port_end: int | None) -> dict[str, str]:
    """Field -> message for a port range no task could use: outside what the
    agent takes, or empty (its end before its start)."""
    low, high = NODE_PORTS
    errors = {}
    for field, port in (("port_start", port_start), ("port_end", port_end)):
        if port is not None and not low <= port <= high:
            errors[field] = f"{field} must be a port from {low} to {high} (as node_agent --ports takes), not {port}"
    if not errors and port_start is not None and port_end is not None and port_end < port_start:
        errors["port_end"] = (f"port_end must be at or after port_start ({port_start}), not {port_end}: "
                              f"the range {port_start}-{port_end} holds no port")
    return errors


class Node(models.Model):
    class Status(models.TextChoices):
        READY = "READY", "ready"
        LOST = "LOST", "lost"

    class DrainMode(models.TextChoices):
        NONE = "", "not draining"
        STOP = "stop", "stop its tasks"
        WAIT = "wait", "wait for its tasks"

    name = models.CharField(max_length=64, unique=True, validators=[node_name_validator])
    address = models.CharField(max_length=255, help_text="Where users and other tasks reach this node.")
    docker_host = models.CharField(max_length=255, help_text="Docker engine URL, e.g. unix:///var/run/docker.sock")
    engine_id = models.CharField(max_length=128, blank=True, help_text="Docker engine ID; nodes sharing one engine share networks.")
    cpus = models.PositiveIntegerField(default=1)
    memory_mb = models.PositiveIntegerField(default=1024)
    # [{"index": 0, "type": "V100"}, ...]
    gpus = models.JSONField(default=list, blank=True)
    gpus_simulated = models.BooleanField(default=False)
    port_start = models.PositiveIntegerField(default=20000)
    port_end = models.PositiveIntegerField(default=20999)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.READY, db_index=True)
    # False = cordoned (as in Kubernetes): the scheduler places no new task here.
    schedulable = models.BooleanField(default=True, help_text="Untick to stop placing new tasks here (cordon).")
    drain_mode = models.CharField(max_length=8, choices=DrainMode.choices, default=DrainMode.NONE, blank=True,
                                  help_text="Set while the node is drained: its tasks are stopped or waited for.")
    cordoned_at = models.DateTimeField(null=True, blank=True)
    cordoned_by = models.CharField(max_length=150, blank=True)
    # A random UUID the agent keeps inside the engine (jobs/node/launcher): unlike docker info's ID,
    # it never collides between cloned machines, so it alone decides "same engine".
    engine_marker = models.CharField(max_length=64, blank=True, db_index=True,
                                     help_text="The engine's own marker; nodes sharing it share networks.")
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    agent_pid = models.IntegerField(null=True, blank=True)
    agent_host = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """What an admin edits must stay what an agent registers: every page
        and the scheduler read `gpus` and the port range as the agent wrote them."""
        if self.gpus is None:  # the admin's JSON box left empty
            self.gpus = []
        errors: dict[str, list] = {field: [message] for field, message
                                   in node_port_range_errors(self.port_start, self.port_end).items()}
        try:
            validate_node_gpus(self.gpus)
        except ValidationError as exc:
            errors["gpus"] = exc.error_list
        if errors:
            raise ValidationError(errors)

    @property
    def queue_name(self) -> str:
        return f"node.{self.name}"

    @property
    def gpu_types(self) -> list[str]:
        return sorted({g["type"] for g in self.gpus})

    @property
    def engine_identity(self) -> str:
        """What decides "same engine" (tasks may use the job network's
        addresses): the engine's marker; a node registered without one (an
        older agent) shares an engine with no other node, only with itself.
        Never docker info's ID, which collides on cloned machines."""
        return self.engine_marker or f"node-{self.pk}"

    def heartbeat_fresh(self, now: datetime) -> bool:
        """Whether the node was heard from within NODE_LOST_AFTER_SECONDS of
        `now`, which is the database's clock (services/db_clock.py
        database_now), as heartbeats are stamped."""
        if self.last_heartbeat is None:
            return False
        return now - self.last_heartbeat <= timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS)


class JobQuerySet(models.QuerySet):
    def visible_to(self, user: User) -> "JobQuerySet":
        if user.is_admin:
            return self
        return self.filter(owner=user)


class State(models.TextChoices):
    WAITING = "WAITING", "waiting"
    RUNNING = "RUNNING", "running"
    STOPPING = "STOPPING", "stopping"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    FAILED = "FAILED", "failed"
    STOPPED = "STOPPED", "stopped"


FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.STOPPED)


class ExitType(models.TextChoices):
    NONE = "", "-"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    USER_EXIT = "USER_EXIT", "the command exited non-zero"
    OOM = "OOM", "killed for exceeding its memory limit"
    IMAGE_PULL = "IMAGE_PULL", "image pull failed"
    NODE_LOST = "NODE_LOST", "node lost"
    # An admin drained the node (stop mode): counts like a node loss, so the job retries elsewhere.
    NODE_DRAINED = "NODE_DRAINED", "node drained"
    USER_STOP = "USER_STOP", "stopped by user"
    COMPLETED = "COMPLETED", "stopped because the job completed"
    # IDLE_GPU_POLICY=stop: its GPUs sat idle past the grace period.
    IDLE_GPUS = "IDLE_GPUS", "idle GPUs reclaimed"
    PLATFORM = "PLATFORM", "platform error"


class JobFacts:
    """What a job's state and attempt number say: for the Job model and for
    the job list's rows (listing.JobRow), which read only those values."""

    __slots__ = ()  # the rows keep theirs
    state: str
    attempt_number: int

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def retries(self) -> int:
        return self.attempt_number - 1


class Job(JobFacts, models.Model):
    # No index of its own: job_name_unique_per_user starts with it (migration 0017).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs", db_index=False)
    name = models.CharField(max_length=128)
    virtual_cluster = models.ForeignKey(VirtualCluster, on_delete=models.PROTECT, related_name="jobs")
    state = models.CharField(max_length=16, choices=State.choices, default=State.WAITING)
    config_raw = models.TextField(help_text="The config exactly as submitted, comments included.")
    config = models.JSONField(help_text="The normalized config: defaults applied, variables substituted.")
    warnings = models.JSONField(default=list, blank=True)
    submitted_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    retry_limit = models.PositiveIntegerField(default=0)
    attempt_number = models.PositiveIntegerField(default=1)
    exit_type = models.CharField(max_length=16, choices=ExitType.choices, default=ExitType.NONE, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_reason = models.TextField(blank=True)
    # What ended the job, as OpenPAI's appExitTrigger* say it: the completion
    # rule that fired and the task that fired it (jobs/completion.py), or a
    # stop, which names no task. NULL until the job ends, and for jobs that
    # ended before they were recorded. NULL rather than "" so that adding
    # them is an ALTER TABLE ADD COLUMN on SQLite, not a copy of the table
    # (which would lose 0015's name-search triggers).
    exit_trigger_message = models.TextField(null=True, blank=True)
    exit_trigger_role = models.CharField(max_length=64, null=True, blank=True)
    exit_trigger_index = models.PositiveIntegerField(null=True, blank=True)
    waiting_reason = models.TextField(blank=True)
    # How many later jobs of its virtual cluster started while this one
    # waited; see jobs/scheduler.py for the anti-starvation rule.
    overtaken = models.PositiveIntegerField(default=0)
    total_tasks = models.PositiveIntegerField(default=0)
    total_gpus = models.PositiveIntegerField(default=0)
    total_roles = models.PositiveIntegerField(default=0)
    gpu_type = models.CharField(max_length=64, blank=True)
    ssh_private_key = models.TextField(blank=True)
    ssh_public_key = models.TextField(blank=True)
    # Protocol v2's secrets, sealed like the private key (jobs/keys.py); read
    # only by the node agent when it starts a container. Never shown.
    secrets_sealed = models.TextField(blank=True)
    upload_outputs = models.BooleanField(default=False)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # Indexed only where set (job_stop_requested_by_idx): a new job has no
    # stopper, and a whole index of NULLs was one more B-tree to write for
    # every submission.
    stop_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="job_name_unique_per_user")]
        indexes = [
            models.Index(fields=["state", "virtual_cluster", "id"], name="job_queue_idx"),
            # The job list's orders (jobs/services/listing.py), ties by id, so that
            # a deep page on PostgreSQL is an index-only scan (bench/job_list.py).
            models.Index(fields=["owner", "-submitted_at", "id"], name="job_owner_recent_idx"),
            models.Index(fields=["-submitted_at", "id"], name="job_recent_idx"),
            # An admin's status and virtual cluster filters together: without it
            # SQLite reads every match through job_queue_idx and sorts them
            # (18,000 of 100,000 jobs in bench/job_list.py) for one page of 50.
            models.Index(fields=["state", "virtual_cluster", "-submitted_at", "id"], name="job_state_vc_recent_idx"),
            models.Index(fields=["name", "id"], name="job_name_sort_idx"),
            models.Index(fields=["total_gpus", "id"], name="job_gpus_sort_idx"),
            models.Index(fields=["total_tasks", "id"], name="job_tasks_sort_idx"),
            models.Index(fields=["attempt_number", "id"], name="job_retries_sort_idx"),
            # Lookups are by a user (`= ?` and `IN`: the SET_NULL when a user
            # goes, the foreign key's own check), which only set rows match.
            models.Index(fields=["stop_requested_by"], condition=Q(stop_requested_by__isnull=False),
                         name="job_stop_requested_by_idx"),
        ]
        ordering = ["-submitted_at", "-id"]

    def __str__(self) -> str:
        return f"{self.owner.username}~{self.name}"

    @property
    def spec(self) -> JobSpec:
        """The job's typed config: the one shape the scheduler, node agents,
        lifecycle and pages read. A stored config never changes, so each
        process builds it once per job (see `_SpecMemo`)."""
        return _spec_memo.get(self)


class _SpecMemo:
    """Typed specs by job, bounded, per process. Keyed by id, owner and name
    so a reused id (a deleted job's) can never return another job's spec."""

    MAX = 10_000

    def __init__(self) -> None:
        self._specs: dict[tuple[int, int, str], JobSpec] = {}

    def get(self, job: Job) -> JobSpec:
        if job.pk is None:
            return JobSpec.from_config(job.config)
        key = (job.pk, job.owner_id, job.name)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) >= self.MAX:
                self._specs.clear()
            spec = self._specs[key] = JobSpec.from_config(job.config)
        return spec


_spec_memo = _SpecMemo()


class JobTag(models.Model):
    """A label on a job (REST v2's PUT/DELETE .../tag); job lists filter by it."""

    MAX_LENGTH = 64
    MAX_PER_JOB = 32

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tags")
    value = models.CharField(max_length=MAX_LENGTH)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "value"], name="job_tag_unique")]
        indexes = [models.Index(fields=["value", "job"], name="job_tag_value_idx")]
        ordering = ["id"]

    def __str__(self) -> str:
        return self.value


class JobAttempt(models.Model):
    """One try of a whole job; retryCount makes more of them."""

    # No index of its own: job_attempt_unique starts with it (migration 0017).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts", db_index=False)
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.WAITING)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_type = models.CharField(max_length=16, choices=ExitType.choices, default=ExitType.NONE, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_reason = models.TextField(blank=True)
    # What ended this attempt, as on Job; a retried job's attempts keep their own.
    exit_trigger_message = models.TextField(null=True, blank=True)
    exit_trigger_role = models.CharField(max_length=64, null=True, blank=True)
    exit_trigger_index = models.PositiveIntegerField(null=True, blank=True)
    # A job with more than one task gets its own Docker network per engine,
    # with this subnet, so its tasks get addresses known before they start.
    subnet = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="job_attempt_unique"),
            models.UniqueConstraint(
                fields=["subnet"], condition=~Q(subnet=""), name="job_attempt_subnet_unique"
            ),
        ]
        indexes = [
            # The dashboard's windows read the attempts that ended within
            # them or are still open (finished_at IS NULL OR >= the start):
            # without it, every attempt of months of history.
            models.Index(fields=["finished_at"], name="job_attempt_finished_idx"),
        ]
        ordering = ["number"]

    def __str__(self) -> str:
        return f"{self.job} attempt {self.number}"

    @property
    def network_name(self) -> str:
        return f"{settings.PAI_INSTANCE}-job-{self.job_id}-{self.number}"


class Task(models.Model):
    """A task of a task role: `<role>-<index>` within its job."""

    # No index of its own: task_unique starts with it (migration 0017).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tasks", db_index=False)
    role = models.CharField(max_length=64)
    index = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "role", "index"], name="task_unique")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.role}-{self.index}"


class TaskState(models.TextChoices):
    ASSIGNED = "ASSIGNED", "assigned"
    LAUNCHING = "LAUNCHING", "launching"
    RUNNING = "RUNNING", "running"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    FAILED = "FAILED", "failed"
    STOPPED = "STOPPED", "stopped"


ACTIVE_TASK_STATES = (TaskState.ASSIGNED, TaskState.LAUNCHING, TaskState.RUNNING)
FINAL_TASK_STATES = (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED)


class TaskAttempt(models.Model):
    """One container: a task in one job attempt, on one node."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attempts")
    job_attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="task_attempts")
    # No index of its own: task_attempt_job_number_idx starts with it.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="task_attempts", db_index=False)
    number = models.PositiveIntegerField(help_text="The job attempt number.")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="task_attempts")
    node_name = models.CharField(max_length=64, blank=True)
    host_ip = models.CharField(max_length=255, blank=True, help_text="The node's address when placed.")
    ip = models.CharField(max_length=64, blank=True, help_text="The task's address on its job network.")
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.ASSIGNED)
    cpus = models.PositiveIntegerField(default=1)
    memory_mb = models.PositiveIntegerField(default=100)
    shm_mb = models.PositiveIntegerField(default=64)
    gpus = models.JSONField(default=list, blank=True)
    gpu_type = models.CharField(max_length=64, blank=True)
    ports = models.JSONField(default=dict, blank=True, help_text='{"label": [port, ...]}')
    container_id = models.CharField(max_length=80, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_type = models.CharField(max_length=16, choices=ExitType.choices, default=ExitType.NONE, blank=True)
    exit_reason = models.TextField(blank=True)
    # Why the platform is stopping this task (an ExitType), set before the
    # container is signalled so the exit is recorded with the right reason.
    stop_reason = models.CharField(max_length=16, choices=ExitType.choices, default=ExitType.NONE, blank=True)
    assigned_at = models.DateTimeField(default=timezone.now)
    launched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    ssh_available = models.BooleanField(null=True, blank=True)
    kept_for_debug = models.BooleanField(default=False)
    last_activity_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "number"], name="task_attempt_unique")]
        indexes = [
            models.Index(fields=["node", "state"], name="task_attempt_node_state_idx"),
            models.Index(fields=["state"], name="task_attempt_state_idx"),
            # One job attempt's tasks (the job page, status calls, usage):
            # a job may hold 1,000 tasks times 100 retries.
            models.Index(fields=["job", "number"], name="task_attempt_job_number_idx"),
            # The dashboard's windows (GPUs held, tasks running), as job_attempt_finished_idx.
            models.Index(fields=["finished_at"], name="task_attempt_finished_idx"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.task} attempt {self.number}"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_TASK_STATES

    @property
    def hostname(self) -> str:
        return f"{self.task.role}-{self.task.index}"


class GpuAllocation(models.Model):
    """A GPU held by an active task attempt; the unique constraint is the
    last line of defence against two tasks getting one GPU."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpu_allocations")
    index = models.PositiveIntegerField()
    attempt = models.ForeignKey(TaskAttempt, on_delete=models.CASCADE, related_name="gpu_allocations")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_allocation_unique")]


class PortAllocation(models.Model):
    """A host port held by an active task attempt. Keyed by the node's
    address: two nodes on one machine share its ports."""

    address = models.CharField(max_length=255)
    port = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="port_allocations")
    attempt = models.ForeignKey(TaskAttempt, on_delete=models.CASCADE, related_name="port_allocations")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["address", "port"], name="port_allocation_unique")]


class TaskUsage(models.Model):
    """One usage sample of a task's container, written by its node agent
    (jobs/node/usage.py) from the container's cgroup counters: detailed
    samples every USAGE_SAMPLE_SECONDS for USAGE_DETAIL_HOURS, then one
    `averaged` row per task and minute for USAGE_MINUTES_DAYS
    (jobs/services/usage.py compacts them)."""

    attempt = models.ForeignKey(TaskAttempt, on_delete=models.CASCADE, related_name="usage_samples")
    at = models.DateTimeField()
    averaged = models.BooleanField(default=False, help_text="A one-minute average of detailed samples.")
    cpu_percent = models.FloatField(help_text="100 = one core busy.")
    memory_bytes = models.BigIntegerField()
    # Counters since the container started (the last one of a minute when averaged).
    network_rx_bytes = models.BigIntegerField(default=0)
    network_tx_bytes = models.BigIntegerField(default=0)
    block_read_bytes = models.BigIntegerField(default=0)
    block_write_bytes = models.BigIntegerField(default=0)
    # [{"index": 0, "utilPercent": 97.0, "memoryUsedBytes": ...}] for real GPUs
    # read through NVML; [] when there are no figures (no GPU, simulated GPUs).
    gpus = models.JSONField(default=list, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["attempt", "at"], name="task_usage_attempt_at_idx"),
            # Detailed and averaged rows apart: the newest detailed samples
            # (/metrics), the oldest ones (compaction), old averages (deletion).
            models.Index(fields=["averaged", "at"], name="task_usage_kind_at_idx"),
        ]
        ordering = ["attempt", "at"]


class JobUsageMinute(models.Model):
    """A job attempt's tasks added up over one minute of their samples, as
    the job-wide usage summary adds up a one-minute bucket, so that a summary
    reads a row a minute whatever the task count (jobs/services/usage_rollup.py
    writes them, usage_series.py reads them). Sums and counts, not only
    means, so minutes add up into wider buckets: each task counts once a
    minute, as the mean of its samples there, and each of its GPUs likewise.
    A row is only as fresh as its minute's UsageMinuteMark says: a minute
    with a mark has samples newer than its row (or no row yet)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    number = models.PositiveIntegerField(help_text="The job attempt.")
    minute = models.BigIntegerField(help_text="Whole minutes since 1970-01-01 UTC.")
    tasks = models.PositiveIntegerField(help_text="Tasks with a sample in the minute.")
    cpu_sum = models.FloatField(help_text="Their CPU percent (each its mean) summed; 100 = one core.")
    cpu_min = models.FloatField()
    cpu_max = models.FloatField()
    memory_sum = models.FloatField(help_text="Their memory in bytes (each its mean) summed.")
    gpus = models.PositiveIntegerField(default=0, help_text="Their GPUs with figures.")
    gpu_sum = models.FloatField(default=0.0, help_text="Those GPUs' utilisation percent (each its mean) summed.")
    gpu_min = models.FloatField(null=True, blank=True)
    gpu_max = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number", "minute"], name="job_usage_minute_unique")]
        indexes = [models.Index(fields=["minute"], name="job_usage_minute_idx")]  # deleting old ones


class UsageMinuteMark(models.Model):
    """A job attempt's minute whose samples changed since it was last rolled
    up into JobUsageMinute: set (or its stamp replaced) by the transaction
    that stores the samples, deleted by the roll-up that read it, only if
    its stamp is still the one read (jobs/services/usage_rollup.py). The
    stamp is the newest sample id of the write that set it: no two writes
    share one, so a mark set again while a minute is rolled up survives."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    number = models.PositiveIntegerField(help_text="The job attempt.")
    minute = models.BigIntegerField(help_text="Whole minutes since 1970-01-01 UTC.")
    stamp = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "number", "minute"], name="usage_minute_mark_unique")]
        indexes = [models.Index(fields=["minute"], name="usage_minute_mark_idx")]  # the roll-up's order


class IdleGpus(models.Model):
    """A running task whose real GPUs have stayed under IDLE_GPU_PERCENT for
    IDLE_GPU_MINUTES; deleted when they get busy again or the task ends."""

    attempt = models.OneToOneField(TaskAttempt, on_delete=models.CASCADE, primary_key=True, related_name="idle_gpus")
    since = models.DateTimeField(help_text="Utilisation has been under the threshold since.")
    flagged_at = models.DateTimeField(default=timezone.now)
    notified_at = models.DateTimeField(null=True, blank=True)


class Stream(models.IntegerChoices):
    STDOUT = 1, "stdout"
    STDERR = 2, "stderr"
    # What the platform did for the task (image pull, code staging, sshd,
    # output upload), kept apart from what the command printed.
    PLATFORM = 3, "platform"


class LogLine(models.Model):
    # No index of its own: log_line_unique starts with it and serves every
    # lookup by attempt; a second index made each stored line a third
    # slower to insert (migration 0016).
    attempt = models.ForeignKey(TaskAttempt, on_delete=models.CASCADE, related_name="log_lines", db_index=False)
    stream = models.PositiveSmallIntegerField(choices=Stream.choices)
    seq = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["attempt", "stream", "seq"], name="log_line_unique")]
        ordering = ["attempt", "stream", "seq"]


class LogCursor(models.Model):
    """How far log capture has got for one stream of one container.

    Written in the same transaction as the lines it covers, so a node agent
    that dies and restarts resumes exactly after the last stored line.
    """

    attempt = models.ForeignKey(TaskAttempt, on_delete=models.CASCADE, related_name="log_cursors")
    stream = models.PositiveSmallIntegerField(choices=Stream.choices)
    next_seq = models.PositiveIntegerField(default=0)
    # Docker's timestamp (ns since the epoch) of the last log entry stored,
    # and how many entries carried exactly that timestamp.
    last_ts_ns = models.BigIntegerField(default=0)
    count_at_ts = models.PositiveIntegerField(default=0)
    bytes_stored = models.BigIntegerField(default=0)
    truncated = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["attempt", "stream"], name="log_cursor_unique")]


class ApiToken(models.Model):
    """A bearer token for the REST API; only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @property
    def is_valid(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


class NodeJoinToken(models.Model):
    """A one-command join for new node machines (scripts/join-node); only its
    SHA-256 is stored. Usable any number of times until it expires or is revoked."""

    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16, db_index=True)
    label = models.CharField(max_length=100, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="node_join_tokens")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_from = models.CharField(max_length=255, blank=True)
    uses = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}…"

    @property
    def is_valid(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


class SshKey(models.Model):
    """A user's own public key, authorized in all their jobs' containers."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    title = models.CharField(max_length=100)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["title"]

    def __str__(self) -> str:
        return self.title


class TerminalSession(models.Model):
    """Audit record of a browser terminal opened into a task."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="terminal_sessions")
    attempt = models.ForeignKey(TaskAttempt, on_delete=models.CASCADE, related_name="terminal_sessions")
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    client_address = models.CharField(max_length=64, blank=True)
    end_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-started_at"]


NOTIFY_STATES = (State.RUNNING, State.SUCCEEDED, State.FAILED, State.STOPPED)


class NotificationSettings(models.Model):
    """What a user wants to be told when one of their jobs changes state: a
    webhook (its secret sealed like jobs' private keys, jobs/keys.py) and
    e-mails for the states they pick (NOTIFY_STATES)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="notification_settings")
    webhook_url = models.CharField(max_length=2000, blank=True)
    webhook_secret_sealed = models.TextField(blank=True)
    email_states = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"notifications of {self.user}"


class NotificationDelivery(models.Model):
    """One notification of one job state change over one channel, with how
    its last try went; the Profile page lists a user's latest."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook", "webhook"
        EMAIL = "email", "e-mail"

    class Status(models.TextChoices):
        PENDING = "PENDING", "pending"
        SENDING = "SENDING", "sending"
        RETRYING = "RETRYING", "will retry"
        DELIVERED = "DELIVERED", "delivered"
        FAILED = "FAILED", "failed"
        # The destination is outside WEBHOOK_ALLOWED_NETWORKS: never tried again.
        REFUSED = "REFUSED", "refused"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_deliveries")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    # The event as it was sent: {"event", "job", "state", ...} (webhooks POST exactly this).
    payload = models.JSONField()
    target = models.CharField(max_length=2000, blank=True, help_text="The URL or e-mail address last tried.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    tries = models.PositiveSmallIntegerField(default=0)
    response_code = models.IntegerField(null=True, blank=True)
    result = models.TextField(blank=True, help_text="How the last try went, in words.")
    created_at = models.DateTimeField(default=timezone.now)
    last_try_at = models.DateTimeField(null=True, blank=True)
    next_try_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["user", "-id"], name="notification_user_recent_idx")]
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.channel} {self.payload.get('job')} {self.payload.get('state')}: {self.status}"


class ImagePull(models.Model):
    """A task attempt's image pull on its node, as the node agent reports it
    (jobs/services/pulls.py): the job page shows it while the task launches.
    One per attempt: tasks of one node that wait for the same image each
    have their own (the engine pulls it once and tells each of them)."""

    class State(models.TextChoices):
        PULLING = "PULLING", "pulling"
        WAITING = "WAITING", "waiting for the registry"  # it could not be reached; asked again soon
        DONE = "DONE", "pulled"
        FAILED = "FAILED", "failed"

    attempt = models.OneToOneField(TaskAttempt, on_delete=models.CASCADE, related_name="image_pull")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    image = models.CharField(max_length=1000)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PULLING)
    layers_done = models.PositiveIntegerField(default=0)
    layers_total = models.PositiveIntegerField(default=0)
    bytes_done = models.PositiveBigIntegerField(default=0, help_text="Downloaded, of the layers whose size is known.")
    bytes_total = models.PositiveBigIntegerField(default=0)
    sizes_pending = models.PositiveIntegerField(default=0, help_text="Layers to download whose size is not known yet.")
    started_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.image} for attempt {self.attempt_id}: {self.state}"

    @property
    def elapsed_seconds(self) -> int:
        return max(0, int(((self.finished_at or timezone.now()) - self.started_at).total_seconds()))
