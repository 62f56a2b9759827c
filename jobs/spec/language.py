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

JOB_NAME_RE = re.compile(r"^[A-Za-z0-9\-._~]+$")
ROLE_NAME_RE = re.compile(r"^[A-Za-z0-9._~]+$")
LABEL_RE = ROLE_NAME_RE
VC_NAME_RE = re.compile(r"^[A-Za-z0-9_]+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BOOLEAN_ENVS = ("isDebug", "paiAzRDMA")

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
PORT_FIELDS = ("label", "beginAt", "portNumber")
DIR_FIELDS = ("authFile", "dataDir", "outputDir", "codeDir")

_SUBST_RE = re.compile(r"\$\{(PAI_DEFAULT_FS_URI|PAI_JOB_NAME|PAI_USER_NAME)\}|\$(PAI_DEFAULT_FS_URI|PAI_JOB_NAME|PAI_USER_NAME)(?![A-Za-z0-9_])")

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

    def resource_string(self) -> str:
        """PAI_RESOURCE_<role>: "gpuNumber,cpuNumber,memMB,shmMB"."""
        return f"{self.gpu_number},{self.cpu_number},{self.memory_mb},{self.shm_mb}"


@dataclass(frozen=True)
class JobSpec:
    job_name: str
    image: str
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
        config.update(self.kept)
        return config


def _role_config(role: TaskRoleSpec) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": role.name,
        "taskNumber": role.task_number,
        "cpuNumber": role.cpu_number,
        "memoryMB": role.memory_mb,
        "shmMB": role.shm_mb,
        "gpuNumber": role.gpu_number,
        "portList": [
            {"label": p.label, "beginAt": p.begin_at, "portNumber": p.port_number} for p in role.ports
        ],
        "command": role.command,
        "minFailedTaskCount": role.min_failed_task_count,
        "minSucceededTaskCount": role.min_succeeded_task_count,
    }
    config.update(role.extra)
    return config


@dataclass(frozen=True)
class ParsedConfig:
    spec: JobSpec
    warnings: list[SpecProblem]
    raw: str

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
    return str(value)

def substitute(value: str, *, job_name: str, user_name: str, default_fs_uri: str) -> str:
    """Replace $PAI_DEFAULT_FS_URI, $PAI_JOB_NAME, $PAI_USER_NAME (or ${...})."""
    values = {"PAI_DEFAULT_FS_URI": default_fs_uri, "PAI_JOB_NAME": job_name, "PAI_USER_NAME": user_name}
    return _SUBST_RE.sub(lambda m: values[m.group(1) or m.group(2)], value)


def default_output_dir(*, default_fs_uri: str, user_name: str, job_name: str) -> str:
    return f"{default_fs_uri.rstrip('/')}/Output/{user_name}/{job_name}"
