"""The language itself: its names and limits, the typed objects a config
parses into, the problems found, and variable substitution. Pure: no
Django, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_CONFIG_BYTES = 256 * 1024  # (ours) far above any real config, small enough to keep a bad paste cheap
MAX_TASKS_PER_JOB = 1000  # (ours)
MAX_TASK_NUMBER = 1000
MAX_CPU_NUMBER = 1024
MAX_MEMORY_MB = 16 * 1024 * 1024
MAX_GPU_NUMBER = 64
MAX_PORT_NUMBER = 100
MAX_RETRY_COUNT = 100
MAX_NAME_LENGTH = 128
# /dev/shm of a v1 task role without shmMB (the v1 reference: 64 MB).
# Protocol v2's differs: jobs/spec/v2.py DEFAULT_SHM_MB.
V1_DEFAULT_SHM_MB = 64

# OpenPAI's patterns, but not "." or "..": a name that is dots only is a
# path segment every HTTP client folds away (GET .../jobs/.), and a job
# named "." was given its owner's whole Output/<user> folder as outputDir.
# Dots, the first character that is none, then anything: said without a
# lookahead, which JSON Schema's patterns (the OpenAPI description) do not
# all take, and with no two parts that can take the same character, so a
# long name is matched in one pass.
JOB_NAME_RE = re.compile(r"^\.*[A-Za-z0-9\-_~][A-Za-z0-9\-._~]*\Z")
ROLE_NAME_RE = re.compile(r"^\.*[A-Za-z0-9_~][A-Za-z0-9._~]*\Z")
LABEL_RE = ROLE_NAME_RE
VC_NAME_RE = re.compile(r"^[A-Za-z0-9_]+\Z")
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9\-._]+\Z")  # at most MAX_GPU_TYPE_LENGTH
MAX_GPU_TYPE_LENGTH = 64
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
BOOLEAN_ENVS = ("isDebug", "paiAzRDMA")
# Variables outside PAI_ that every task gets from the platform (jobs/environment.py):
# a jobEnvs entry of that name is replaced, so the config is warned.
PLATFORM_ENVS = {
    "NVIDIA_VISIBLE_DEVICES": "set by the platform from the task's GPUs; this value is replaced",
}

JOB_FIELDS = (
    "jobName", "image", "authFile", "dataDir", "outputDir", "codeDir", "virtualCluster",
    "taskRoles", "gpuType", "retryCount", "jobEnvs", "extras", "killAllOnCompletedTaskNumber",
)
# Seen in the reference examples but not in the field table: accepted and kept.
JOB_KEPT_FIELDS = ("tmp",)
ROLE_FIELDS = (
    "name", "taskNumber", "cpuNumber", "memoryMB", "shmMB", "gpuNumber", "portList", "command",
    "minFailedTaskCount", "minSucceededTaskCount",
)
ROLE_KEPT_FIELDS = ("storageGB",)
# Keys only a protocol v2 config puts into the normalized (v1-shaped)
# config; a v1 config may not hold them, or they would take effect once
# stored (`JobSpec.from_config` reads them).
V2_ONLY_JOB_KEYS = ("imageAuth",)
V2_ONLY_ROLE_KEYS = ("roleImage", "roleImageAuth")
PORT_FIELDS = ("label", "beginAt", "portNumber")
DIR_FIELDS = ("authFile", "dataDir", "outputDir", "codeDir")

# $PAI_USERNAME too: OpenPAI's REST server replaced it as PAI_USER_NAME's twin.
_SUBST_RE = re.compile(r"\$\{(PAI_DEFAULT_FS_URI|PAI_JOB_NAME|PAI_USER_NAME|PAI_USERNAME)\}"
                       r"|\$(PAI_DEFAULT_FS_URI|PAI_JOB_NAME|PAI_USER_NAME|PAI_USERNAME)(?![A-Za-z0-9_])")

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong (or suspicious) in a config."""

    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line}, column {self.column})" if self.line else ""
        return f"{self.path or 'config'}: {self.message}{where}"

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "message": self.message, "line": self.line, "column": self.column}


class SpecError(ValueError):
    """The config cannot be accepted; `problems` lists every reason."""

    def __init__(self, problems: list[SpecProblem], warnings: list[SpecProblem] | None = None) -> None:
        self.problems = problems
        self.warnings = warnings or []
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class PortSpec:
    label: str
    begin_at: int
    port_number: int
    # Fields of the entry this portal does not use, kept in the stored config.
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def fixed(self) -> range:
        """The ports asked for exactly; empty for beginAt 0 (any free ports)."""
        return range(self.begin_at, self.begin_at + self.port_number) if self.begin_at else range(0)


@dataclass(frozen=True)
class TaskRoleSpec:
    name: str
    task_number: int
    cpu_number: int
    memory_mb: int
    shm_mb: int
    gpu_number: int
    ports: tuple[PortSpec, ...]
    command: str
    # None means "never" (the reference: a null minFailedTaskCount means task
    # failures never fail the job); an omitted minFailedTaskCount is 1.
    min_failed_task_count: int | None
    min_succeeded_task_count: int | None
    extra: dict[str, Any] = field(default_factory=dict)
    # Protocol v2's dockerImage per task role, set only when it differs from
    # the job's (`JobSpec.image`, the first role's); None: the job's image
    # and image_auth. A role with its own image has its own credentials
    # (None: none), never the job's, which are for another registry.
    image: str | None = None
    image_auth: dict[str, str] | None = None

    def resource_string(self) -> str:
        """PAI_RESOURCE_<role>: "gpuNumber,cpuNumber,memMB,shmMB"."""
        return f"{self.gpu_number},{self.cpu_number},{self.memory_mb},{self.shm_mb}"


@dataclass(frozen=True)
class JobSpec:
    job_name: str
    image: str  # v2: the first task role's; role_image() gives each role's
    auth_file: str | None
    data_dir: str | None
    output_dir: str
    code_dir: str | None
    virtual_cluster: str
    task_roles: tuple[TaskRoleSpec, ...]
    gpu_type: str | None
    retry_count: int
    kill_all_on_completed_task_number: int | None
    job_envs: dict[str, Scalar]
    extras: dict[str, Any]
    # Top-level keys outside the field table ("tmp" and unknown ones), kept so
    # that a config round-trips without loss.
    kept: dict[str, Any] = field(default_factory=dict)
    # Registry credentials given in the config itself (protocol v2's
    # dockerimage auth): {"registry", "username", "password"}, the password
    # only ever as a secret reference (v2_text.secret_ref), never its value.
    image_auth: dict[str, str] | None = None

    @property
    def total_tasks(self) -> int:
        return sum(role.task_number for role in self.task_roles)

    @property
    def total_gpus(self) -> int:
        return sum(role.task_number * role.gpu_number for role in self.task_roles)

    @property
    def is_debug(self) -> bool:
        return self.job_envs.get("isDebug") is True

    def role(self, name: str) -> TaskRoleSpec:
        for role in self.task_roles:
            if role.name == name:
                return role
        raise KeyError(name)

    def role_image(self, name: str) -> tuple[str, dict[str, str] | None]:
        """The image the tasks of role `name` run, and the registry
        credentials the config gives for it."""
        role = self.role(name)
        if role.image is None:
            return self.image, self.image_auth
        return role.image, role.image_auth

    def to_config(self) -> dict[str, Any]:
        """The normalized v1 config: defaults applied, substitutions done."""
        config: dict[str, Any] = {
            "jobName": self.job_name,
            "image": self.image,
            "authFile": self.auth_file or "",
            "dataDir": self.data_dir or "",
            "outputDir": self.output_dir,
            "codeDir": self.code_dir or "",
            "virtualCluster": self.virtual_cluster,
            "taskRoles": [_role_config(role) for role in self.task_roles],
            "gpuType": self.gpu_type or "",
            "retryCount": self.retry_count,
            "jobEnvs": dict(self.job_envs),
            "extras": self.extras,
        }
        if self.kill_all_on_completed_task_number is not None:
            config["killAllOnCompletedTaskNumber"] = self.kill_all_on_completed_task_number
        if self.image_auth is not None:
            config["imageAuth"] = dict(self.image_auth)
        config.update(self.kept)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> JobSpec:
        """The typed spec back from `to_config()`'s output, as stored with a
        job. No validation: the config was validated when it was stored, and
        this is the cheap way back (no text, no positions, no problems)."""
        rest = {k: v for k, v in config.items() if k not in _JOB_KEYS}
        return cls(
            job_name=config["jobName"], image=config["image"], auth_file=config.get("authFile") or None,
            data_dir=config.get("dataDir") or None, output_dir=config["outputDir"],
            code_dir=config.get("codeDir") or None, virtual_cluster=config["virtualCluster"],
            task_roles=tuple(_role_from_config(role) for role in config["taskRoles"]),
            gpu_type=config.get("gpuType") or None, retry_count=config.get("retryCount", 0),
            kill_all_on_completed_task_number=config.get("killAllOnCompletedTaskNumber"),
            job_envs=dict(config.get("jobEnvs") or {}), extras=dict(config.get("extras") or {}), kept=rest,
            image_auth=dict(config["imageAuth"]) if isinstance(config.get("imageAuth"), dict) else None,
        )


_JOB_KEYS = frozenset((
    "jobName", "image", "authFile", "dataDir", "outputDir", "codeDir", "virtualCluster", "taskRoles", "gpuType",
    "retryCount", "jobEnvs", "extras", "killAllOnCompletedTaskNumber", *V2_ONLY_JOB_KEYS,
))
_PORT_KEYS = frozenset(("label", "beginAt", "portNumber"))
_ROLE_KEYS = frozenset((
    "name", "taskNumber", "cpuNumber", "memoryMB", "shmMB", "gpuNumber", "portList", "command",
    "minFailedTaskCount", "minSucceededTaskCount", *V2_ONLY_ROLE_KEYS,
))


def _role_from_config(role: dict[str, Any]) -> TaskRoleSpec:
    return TaskRoleSpec(
        name=role["name"], task_number=role["taskNumber"], cpu_number=role["cpuNumber"],
        memory_mb=role["memoryMB"], shm_mb=role.get("shmMB", 64), gpu_number=role["gpuNumber"],
        ports=tuple(PortSpec(label=p["label"], begin_at=p["beginAt"], port_number=p["portNumber"],
                             extra={k: v for k, v in p.items() if k not in _PORT_KEYS})
                    for p in role.get("portList") or ()),
        command=role["command"], min_failed_task_count=role.get("minFailedTaskCount", 1),
        min_succeeded_task_count=role.get("minSucceededTaskCount"),
        extra={k: v for k, v in role.items() if k not in _ROLE_KEYS},
        image=role.get("roleImage"),
        image_auth=dict(role["roleImageAuth"]) if isinstance(role.get("roleImageAuth"), dict) else None,
    )


def _role_config(role: TaskRoleSpec) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": role.name,
        "taskNumber": role.task_number,
        "cpuNumber": role.cpu_number,
        "memoryMB": role.memory_mb,
        "shmMB": role.shm_mb,
        "gpuNumber": role.gpu_number,
        "portList": [
            {"label": p.label, "beginAt": p.begin_at, "portNumber": p.port_number, **p.extra} for p in role.ports
        ],
        "command": role.command,
        "minFailedTaskCount": role.min_failed_task_count,
        "minSucceededTaskCount": role.min_succeeded_task_count,
    }
    if role.image is not None:
        config["roleImage"] = role.image
    if role.image_auth is not None:
        config["roleImageAuth"] = dict(role.image_auth)
    config.update(role.extra)
    return config


@dataclass(frozen=True)
class ParsedConfig:
    spec: JobSpec
    warnings: list[SpecProblem]
    # The text to keep as "submitted": as typed for v1; for v2 with every
    # secret masked (jobs/spec/v2_text.py).
    raw: str
    # Protocol v2's secrets, to be sealed with the job and given to the node
    # agent only; never in `spec` or `raw`.
    secrets: dict[str, Any] = field(default_factory=dict, repr=False)
    protocol_version: int = 1

    @property
    def normalized(self) -> dict[str, Any]:
        return self.spec.to_config()


def env_value(value: Scalar) -> str:
    """How a jobEnvs value appears in the container: JSON spelling for
    booleans and null, so `isDebug: true` reads "true" as in OpenPAI."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))  # 1e6 and 1.0 read "1000000" and "1", as JavaScript writes them
    return str(value)

def substitute(value: str, *, job_name: str, user_name: str, default_fs_uri: str) -> str:
    """Replace $PAI_DEFAULT_FS_URI, $PAI_JOB_NAME, $PAI_USER_NAME (or ${...})."""
    values = {"PAI_DEFAULT_FS_URI": default_fs_uri, "PAI_JOB_NAME": job_name, "PAI_USER_NAME": user_name,
              "PAI_USERNAME": user_name}
    return _SUBST_RE.sub(lambda m: values[m.group(1) or m.group(2)], value)


def default_output_dir(*, default_fs_uri: str, user_name: str, job_name: str) -> str:
    return f"{default_fs_uri.rstrip('/')}/Output/{user_name}/{job_name}"
