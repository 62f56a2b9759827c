"""The job-config language: OpenPAI's v1 JSON, parsed into typed objects.

One parser serves the web form, the JSON box, file import and the REST API.
It is pure: no Django, no I/O. Everything the reference documents in the
project's docs/spec folder say about a field is enforced here, and every
problem is reported at once with its path (``taskRoles[1].memoryMB``), what
was expected, and, when the text is at hand, its line and column.

Choices where the reference is silent are marked "(ours)".
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from jobs import jsonc

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

_SUBSTITUTED = ("PAI_DEFAULT_FS_URI", "PAI_JOB_NAME", "PAI_USER_NAME")
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


# --------------------------------------------------------------------- reading


def decode_text(data: str | bytes) -> str:
    """Bytes from an upload or a request body become text, or a SpecError."""
    if isinstance(data, str):
        text = data
    else:
        if len(data) > MAX_CONFIG_BYTES:
            raise _too_big(len(data))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError([SpecProblem("", f"the file is not UTF-8 text (bad byte at offset {exc.start})")]) from None
    return text.removeprefix("\ufeff")


def _too_big(size: int) -> SpecError:
    return SpecError(
        [SpecProblem("", f"the config is {size // 1024} KB; the limit is {MAX_CONFIG_BYTES // 1024} KB")]
    )


def parse_job_config(data: str | bytes, *, user_name: str, default_fs_uri: str) -> ParsedConfig:
    """Parse a v1 job config (JSON, comments allowed) into a JobSpec.

    Raises SpecError listing every problem; never anything else.
    """
    text = decode_text(data)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise _too_big(len(text.encode("utf-8", "surrogatepass")))
    if not text.strip():
        raise SpecError([SpecProblem("", "the config is empty: paste or upload a JSON job config")])
    if re.match(r"\s*protocolVersion\s*:", text):
        raise SpecError([SpecProblem("", "this looks like an OpenPAI v2 YAML config; this portal takes the v1 JSON format (jobName, image, taskRoles ...)")])
    try:
        document = jsonc.loads(text)
    except jsonc.JsoncSyntaxError as exc:
        raise SpecError([SpecProblem("", f"invalid JSON: {exc.message}", exc.line, exc.column)]) from None
    validator = _Validator(document.positions)
    spec = validator.job(document.value, user_name=user_name, default_fs_uri=default_fs_uri)
    if validator.problems or spec is None:
        raise SpecError(validator.problems, validator.warnings)
    return ParsedConfig(spec=spec, warnings=validator.warnings, raw=text)


def parse_job_value(value: Any, *, user_name: str, default_fs_uri: str) -> ParsedConfig:
    """Validate an already-decoded config (for example a JSON API body)."""
    try:
        text = json.dumps(value, ensure_ascii=False, indent=2)
    except (TypeError, ValueError) as exc:
        raise SpecError([SpecProblem("", f"not a JSON value: {exc}")]) from None
    return parse_job_config(text, user_name=user_name, default_fs_uri=default_fs_uri)


def substitute(value: str, *, job_name: str, user_name: str, default_fs_uri: str) -> str:
    """Replace $PAI_DEFAULT_FS_URI, $PAI_JOB_NAME, $PAI_USER_NAME (or ${...})."""
    values = {"PAI_DEFAULT_FS_URI": default_fs_uri, "PAI_JOB_NAME": job_name, "PAI_USER_NAME": user_name}
    return _SUBST_RE.sub(lambda m: values[m.group(1) or m.group(2)], value)


def default_output_dir(*, default_fs_uri: str, user_name: str, job_name: str) -> str:
    return f"{default_fs_uri.rstrip('/')}/Output/{user_name}/{job_name}"


# ------------------------------------------------------------------ validating


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {json.dumps(shown, ensure_ascii=False)}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class _Validator:
    def __init__(self, positions: dict[str, tuple[int, int]]) -> None:
        self.positions = positions
        self.problems: list[SpecProblem] = []
        self.warnings: list[SpecProblem] = []

    # -- reporting

    def _position(self, path: str) -> tuple[int | None, int | None]:
        """Where `path` starts in the text, or its nearest enclosing value."""
        probe = path
        while True:
            if probe in self.positions:
                return self.positions[probe]
            if not probe:
                return None, None
            parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", probe)
            probe = "" if parent == probe else parent

    def error(self, path: str, message: str) -> None:
        line, column = self._position(path)
        self.problems.append(SpecProblem(path, message, line, column))

    def warn(self, path: str, message: str) -> None:
        line, column = self.positions.get(path + "#key", self._position(path))
        self.warnings.append(SpecProblem(path, message, line, column))

    # -- typed getters: each returns the value or None after reporting

    def integer(self, obj: dict, key: str, path: str, *, required: bool, minimum: int,
                maximum: int, default: int | None = None, unit: str = "", nullable: bool = False) -> int | None:
        where = f"{path}.{key}" if path else key
        if key not in obj:
            if required:
                self.error(where, f"is required: a whole number of at least {minimum}{unit}")
            return default
        value = obj[key]
        if value is None and nullable:
            return None
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            expected = "a whole number" + (" or null" if nullable else "")
            self.error(where, f"expected {expected}, got {_describe(value)}")
            return None
        if value < minimum:
            self.error(where, f"expected at least {minimum}{unit}, got {value}")
            return None
        if value > maximum:
            self.error(where, f"expected at most {maximum}{unit}, got {value}")
            return None
        return value

    def string(self, obj: dict, key: str, path: str, *, required: bool, pattern: re.Pattern | None = None,
               pattern_help: str = "", max_length: int = 4096, allow_empty: bool = True) -> str | None:
        where = f"{path}.{key}" if path else key
        if key not in obj or (obj[key] is None and not required):
            if required:
                self.error(where, "is required" + (f": {pattern_help}" if pattern_help else ""))
            return None
        value = obj[key]
        if not isinstance(value, str):
            self.error(where, f"expected a string, got {_describe(value)}")
            return None
        if not value.strip():
            if allow_empty and not required:
                return None
            self.error(where, "must not be empty" + (f": {pattern_help}" if pattern_help else ""))
            return None
        if len(value) > max_length:
            self.error(where, f"expected at most {max_length} characters, got {len(value)}")
            return None
        if pattern is not None and not pattern.match(value):
            self.error(where, f"expected {pattern_help}, got {_describe(value)}")
            return None
        return value

    def unknown_keys(self, obj: dict, path: str, known: tuple[str, ...], kept: tuple[str, ...]) -> dict[str, Any]:
        """Warn about keys outside the table; return them so they are kept."""
        extra: dict[str, Any] = {}
        for key in obj:
            if key in known:
                continue
            extra[key] = obj[key]
            if key in kept:
                continue
            where = f"{path}.{key}" if path else key
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            if not close:
                lowered = {k.lower(): k for k in known}
                if key.lower() in lowered:
                    close = [lowered[key.lower()]]
            hint = f'; did you mean "{close[0]}"?' if close else ""
            self.warn(where, f'unknown field "{key}" is kept in the stored config but not used{hint}')
        return extra

    # -- the config

    def job(self, value: Any, *, user_name: str, default_fs_uri: str) -> JobSpec | None:
        if not isinstance(value, dict):
            self.error("", f"expected a JSON object {{...}} holding jobName, image and taskRoles, got {_describe(value)}")
            return None
        name_help = "letters, digits and - . _ ~ (pattern ^[A-Za-z0-9\\-._~]+$)"
        job_name = self.string(value, "jobName", "", required=True, pattern=JOB_NAME_RE,
                               pattern_help=name_help, max_length=MAX_NAME_LENGTH, allow_empty=False)
        image = self.string(value, "image", "", required=True, max_length=512, allow_empty=False,
                            pattern=re.compile(r"^\S+$"), pattern_help="a Docker image name without spaces, like busybox:latest")
        dirs: dict[str, str | None] = {}
        for key in DIR_FIELDS:
            raw = self.string(value, key, "", required=False, max_length=2048)
            if raw is not None:
                raw = substitute(raw, job_name=job_name or "", user_name=user_name, default_fs_uri=default_fs_uri)
            dirs[key] = raw
        vc = self.string(value, "virtualCluster", "", required=False, pattern=VC_NAME_RE,
                         pattern_help="letters, digits and _ (pattern ^[A-Za-z0-9_]+$)", max_length=64)
        gpu_type = self.string(value, "gpuType", "", required=False, max_length=64,
                               pattern=re.compile(r"^[A-Za-z0-9\-._]+$"), pattern_help="a GPU type name like V100")
        retry = self.integer(value, "retryCount", "", required=False, minimum=0, maximum=MAX_RETRY_COUNT, default=0)
        kill_all = self.integer(value, "killAllOnCompletedTaskNumber", "", required=False, minimum=0,
                                maximum=MAX_TASKS_PER_JOB, default=None, nullable=True)
        roles = self.task_roles(value)
        envs = self.job_envs(value)
        extras = self.extras(value)
        kept = self.unknown_keys(value, "", JOB_FIELDS, JOB_KEPT_FIELDS)
        if kill_all is not None and roles:
            total = sum(r.task_number for r in roles)
            if kill_all > total:
                self.error("killAllOnCompletedTaskNumber", f"expected at most the job's task count ({total}), got {kill_all}")
        if self.problems or job_name is None or image is None or roles is None or envs is None or extras is None:
            return None
        output_dir = dirs["outputDir"] or default_output_dir(
            default_fs_uri=default_fs_uri, user_name=user_name, job_name=job_name
        )
        return JobSpec(
            job_name=job_name, image=image, auth_file=dirs["authFile"], data_dir=dirs["dataDir"],
            output_dir=output_dir, code_dir=dirs["codeDir"], virtual_cluster=vc or "default",
            task_roles=tuple(roles), gpu_type=gpu_type, retry_count=retry or 0,
            kill_all_on_completed_task_number=kill_all, job_envs=envs, extras=extras, kept=kept,
        )

    def task_roles(self, value: dict) -> list[TaskRoleSpec] | None:
        if "taskRoles" not in value:
            self.error("taskRoles", "is required: a list with at least one task role")
            return None
        roles_value = value["taskRoles"]
        if not isinstance(roles_value, list):
            self.error("taskRoles", f"expected a list of task roles, got {_describe(roles_value)}")
            return None
        if not roles_value:
            self.error("taskRoles", "expected at least one task role, got an empty list")
            return None
        roles: list[TaskRoleSpec] = []
        seen: dict[str, int] = {}
        for index, item in enumerate(roles_value):
            path = f"taskRoles[{index}]"
            role = self.task_role(item, path)
            if role is None:
                continue
            if role.name in seen:
                self.error(f"{path}.name", f'duplicate task role name "{role.name}" (also taskRoles[{seen[role.name]}].name); names must be unique in a job')
                continue
            seen[role.name] = index
            roles.append(role)
        total = sum(r.task_number for r in roles)
        if total > MAX_TASKS_PER_JOB:
            self.error("taskRoles", f"expected at most {MAX_TASKS_PER_JOB} tasks in a job, got {total}")
        return roles

    def task_role(self, item: Any, path: str) -> TaskRoleSpec | None:
        if not isinstance(item, dict):
            self.error(path, f"expected a task role object {{name, taskNumber, cpuNumber, memoryMB, gpuNumber, command}}, got {_describe(item)}")
            return None
        before = len(self.problems)
        name = self.string(item, "name", path, required=True, pattern=ROLE_NAME_RE, allow_empty=False,
                           pattern_help="letters, digits and . _ ~ (pattern ^[A-Za-z0-9._~]+$)", max_length=64)
        tasks = self.integer(item, "taskNumber", path, required=True, minimum=1, maximum=MAX_TASK_NUMBER)
        cpus = self.integer(item, "cpuNumber", path, required=True, minimum=1, maximum=MAX_CPU_NUMBER)
        memory = self.integer(item, "memoryMB", path, required=True, minimum=100, maximum=MAX_MEMORY_MB, unit=" MB")
        shm = self.integer(item, "shmMB", path, required=False, minimum=0, maximum=MAX_MEMORY_MB, default=64, unit=" MB")
        gpus = self.integer(item, "gpuNumber", path, required=True, minimum=0, maximum=MAX_GPU_NUMBER)
        command = self.string(item, "command", path, required=True, allow_empty=False, max_length=64 * 1024,
                              pattern_help="the shell command each task runs")
        if shm is not None and memory is not None and shm > memory:
            self.error(f"{path}.shmMB", f"expected at most memoryMB ({memory}), got {shm}")
        min_failed = self.integer(item, "minFailedTaskCount", path, required=False, minimum=1,
                                  maximum=MAX_TASK_NUMBER, default=1, nullable=True)
        min_succeeded = self.integer(item, "minSucceededTaskCount", path, required=False, minimum=1,
                                     maximum=MAX_TASK_NUMBER, default=None, nullable=True)
        for key, count in (("minFailedTaskCount", min_failed), ("minSucceededTaskCount", min_succeeded)):
            if count is not None and tasks is not None and count > tasks:
                self.error(f"{path}.{key}", f"expected null or between 1 and taskNumber ({tasks}), got {count}")
        self.integer(item, "storageGB", path, required=False, minimum=0, maximum=10**6, nullable=True)
        ports = self.port_list(item, path)
        extra = self.unknown_keys(item, path, ROLE_FIELDS, ROLE_KEPT_FIELDS)
        if len(self.problems) > before or None in (name, tasks, cpus, memory, gpus, command, ports):
            return None
        return TaskRoleSpec(
            name=name, task_number=tasks, cpu_number=cpus, memory_mb=memory,  # type: ignore[arg-type]
            shm_mb=64 if shm is None else shm, gpu_number=gpus, ports=tuple(ports),  # type: ignore[arg-type]
            command=command, min_failed_task_count=min_failed,  # type: ignore[arg-type]
            min_succeeded_task_count=min_succeeded, extra=extra,
        )

    def port_list(self, item: dict, path: str) -> list[PortSpec] | None:
        if item.get("portList") is None:
            return []
        value = item["portList"]
        where = f"{path}.portList"
        if not isinstance(value, list):
            self.error(where, f"expected a list of {{label, beginAt, portNumber}}, got {_describe(value)}")
            return None
        ports: list[PortSpec] = []
        labels: dict[str, int] = {}
        for index, entry in enumerate(value):
            port_path = f"{where}[{index}]"
            if not isinstance(entry, dict):
                self.error(port_path, f"expected an object {{label, beginAt, portNumber}}, got {_describe(entry)}")
                continue
            before = len(self.problems)
            label = self.string(entry, "label", port_path, required=True, pattern=LABEL_RE, allow_empty=False,
                                pattern_help="letters, digits and . _ ~ (pattern ^[A-Za-z0-9._~]+$)", max_length=64)
            begin = self.integer(entry, "beginAt", port_path, required=True, minimum=0, maximum=65535)
            number = self.integer(entry, "portNumber", port_path, required=True, minimum=1, maximum=MAX_PORT_NUMBER)
            self.unknown_keys(entry, port_path, PORT_FIELDS, ())
            if begin and number and begin + number - 1 > 65535:
                self.error(f"{port_path}.beginAt", f"ports {begin}..{begin + number - 1} go past 65535")
            if label is not None and label in labels:
                self.error(f"{port_path}.label", f'duplicate port label "{label}" (also {where}[{labels[label]}].label); labels must be unique in a task role')
            elif label is not None:
                labels[label] = index
            if len(self.problems) == before and label is not None and begin is not None and number is not None:
                ports.append(PortSpec(label=label, begin_at=begin, port_number=number))
        return ports

    def job_envs(self, value: dict) -> dict[str, Scalar] | None:
        envs = value.get("jobEnvs")
        if envs is None:
            return {}
        if not isinstance(envs, dict):
            self.error("jobEnvs", f"expected an object of name: value pairs, got {_describe(envs)}")
            return None
        result: dict[str, Scalar] = {}
        for key, item in envs.items():
            where = f"jobEnvs.{key}"
            if not ENV_NAME_RE.match(key) or len(key) > 128:
                self.error(where, "expected an environment variable name: letters, digits and _, not starting with a digit")
                continue
            if key.startswith("PAI_"):
                self.error(where, "names starting with PAI_ are set by the platform; choose another name")
                continue
            if key in BOOLEAN_ENVS:
                if not isinstance(item, bool):
                    self.error(where, f"expected true or false, got {_describe(item)}")
                    continue
            elif isinstance(item, (dict, list)):
                self.error(where, f"expected a string, number, boolean or null, got {_describe(item)}")
                continue
            result[key] = item
        return result

    def extras(self, value: dict) -> dict[str, Any] | None:
        extras = value.get("extras")
        if extras is None:
            return {}
        if not isinstance(extras, dict):
            self.error("extras", f"expected an object, got {_describe(extras)}")
            return None
        return extras


def env_value(value: Scalar) -> str:
    """How a jobEnvs value appears in the container: JSON spelling for
    booleans and null, so `isDebug: true` reads "true" as in OpenPAI."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)
