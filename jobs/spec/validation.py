"""Checks a decoded config field by field, collecting every problem with its
path, what was expected, and its place in the text. Pure: no Django, no I/O."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from jobs.jsonc import Positions
from jobs.spec.language import (
    MAX_TASKS_PER_JOB, MAX_TASK_NUMBER, MAX_CPU_NUMBER, MAX_MEMORY_MB, MAX_GPU_NUMBER, MAX_PORT_NUMBER,
    MAX_RETRY_COUNT, MAX_NAME_LENGTH, V1_DEFAULT_SHM_MB, JOB_NAME_RE, ROLE_NAME_RE, LABEL_RE, VC_NAME_RE, ENV_NAME_RE,
    GPU_TYPE_RE, MAX_GPU_TYPE_LENGTH, BOOLEAN_ENVS, PLATFORM_ENVS, JOB_FIELDS, JOB_KEPT_FIELDS, ROLE_FIELDS, ROLE_KEPT_FIELDS, PORT_FIELDS, DIR_FIELDS, Scalar,
    V2_ONLY_JOB_KEYS, V2_ONLY_ROLE_KEYS, SpecProblem, PortSpec, TaskRoleSpec, JobSpec, substitute,
    default_output_dir,
)



# The most problems (and warnings) listed for one config; the rest are counted.
MAX_REPORTED = 100
# What ROLE_NAME_RE (and LABEL_RE, the same) takes, in words.
ROLE_NAME_HELP = "letters, digits and . _ ~, not dots only (pattern ^[A-Za-z0-9._~]+$)"


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
    def __init__(self, positions: Positions) -> None:
        self.positions = positions
        self.problems: list[SpecProblem] = []
        self.warnings: list[SpecProblem] = []
        # Counted beyond the lists: a hostile config may hold a problem per
        # value, and nobody reads more than MAX_REPORTED of them.
        self.problem_count = 0
        self.warning_count = 0

    # -- reporting

    def _position(self, path: str) -> tuple[int | None, int | None]:
        """Where `path` starts in the text, or its nearest enclosing value."""
        return self.positions.nearest(path)

    def error(self, path: str, message: str) -> None:
        self.problem_count += 1
        if self.problem_count <= MAX_REPORTED:
            line, column = self._position(path)
            self.problems.append(SpecProblem(path, message, line, column))

    def warn(self, path: str, message: str) -> None:
        self.warning_count += 1
        if self.warning_count <= MAX_REPORTED:
            line, column = self.positions.get(path + "#key") or self._position(path)
            self.warnings.append(SpecProblem(path, message, line, column))

    @property
    def gave_up(self) -> bool:
        """Past MAX_REPORTED problems, long lists are not checked further:
        a hostile config must not cost a worker time in proportion to it."""
        return self.problem_count > MAX_REPORTED

    @property
    def reporting_warnings(self) -> bool:
        """False once no more warnings are shown: skip working out hints."""
        return self.warning_count < MAX_REPORTED

    def finish(self) -> None:
        """Say how many problems and warnings were left out, if any."""
        for count, items, what in ((self.problem_count, self.problems, "problems"),
                                   (self.warning_count, self.warnings, "warnings")):
            if count > MAX_REPORTED:
                items.append(SpecProblem("", f"... and more {what} not listed (checking stops after "
                                             f"{MAX_REPORTED}); fix these first"))

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
        if pattern is not None and not pattern.fullmatch(value):
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
            if not self.reporting_warnings:
                self.warn(where, "")  # counted, not shown: no hint worth working out
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            if not close:
                lowered = {k.lower(): k for k in known}
                if key.lower() in lowered:
                    close = [lowered[key.lower()]]
            hint = f'; did you mean "{close[0]}"?' if close else ""
            self.warn(where, f'unknown field "{key}" is kept in the stored config but not used{hint}')
        return extra

    def v2_only(self, obj: dict, path: str, keys: tuple[str, ...], message: str) -> None:
        """Refuse what only a v2 config's normalized form may hold: kept as
        unknown, it would take effect once the job is stored."""
        for key in keys:
            if key in obj:
                self.error(f"{path}.{key}" if path else key, message)

    # -- the config

    def job(self, value: Any, *, user_name: str, default_fs_uri: str) -> JobSpec | None:
        if not isinstance(value, dict):
            self.error("", f"expected a JSON object {{...}} holding jobName, image and taskRoles, got {_describe(value)}")
            return None
        name_help = "letters, digits and - . _ ~, not dots only (pattern ^[A-Za-z0-9\\-._~]+$)"
        job_name = self.string(value, "jobName", "", required=True, pattern=JOB_NAME_RE,
                               pattern_help=name_help, max_length=MAX_NAME_LENGTH, allow_empty=False)
        image = self.string(value, "image", "", required=True, max_length=512, allow_empty=False,
                            pattern=re.compile(r"^\S+\Z"), pattern_help="a Docker image name without spaces, like busybox:latest")
        dirs: dict[str, str | None] = {}
        for key in DIR_FIELDS:
            raw = self.string(value, key, "", required=False, max_length=2048)
            if raw is not None:
                raw = substitute(raw, job_name=job_name or "", user_name=user_name, default_fs_uri=default_fs_uri)
            dirs[key] = raw
        vc = self.string(value, "virtualCluster", "", required=False, pattern=VC_NAME_RE,
                         pattern_help="letters, digits and _ (pattern ^[A-Za-z0-9_]+$)", max_length=64)
        gpu_type = self.string(value, "gpuType", "", required=False, max_length=MAX_GPU_TYPE_LENGTH,
                               pattern=GPU_TYPE_RE, pattern_help="a GPU type name like V100")
        retry = self.integer(value, "retryCount", "", required=False, minimum=0, maximum=MAX_RETRY_COUNT, default=0)
        # Any count is taken (OpenPAI's schema has no maximum; one above the
        # job's tasks is warned about below), up to a 32-bit integer's.
        kill_all = self.integer(value, "killAllOnCompletedTaskNumber", "", required=False, minimum=0,
                                maximum=2**31 - 1, default=None, nullable=True)
        roles = self.task_roles(value)
        envs = self.job_envs(value)
        extras = self.extras(value)
        self.v2_only(value, "", V2_ONLY_JOB_KEYS, "registry credentials in the config are protocol v2's (a "
                     'dockerimage prerequisite\'s auth); a v1 config names a file holding them in "authFile"')
        kept = self.unknown_keys(value, "", JOB_FIELDS, (*JOB_KEPT_FIELDS, *V2_ONLY_JOB_KEYS))
        if kill_all is not None and roles:
            total = sum(r.task_number for r in roles)
            if kill_all > total:
                # OpenPAI takes it (no upper bound in its schema); it simply never triggers.
                self.warn("killAllOnCompletedTaskNumber", f"the job has only {total} tasks, so {kill_all} completed "
                          "tasks never happen; the job ends when its tasks do")
        if self.problem_count or job_name is None or image is None or roles is None or envs is None or extras is None:
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
            if self.gave_up:
                break
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
        before = self.problem_count
        name = self.string(item, "name", path, required=True, pattern=ROLE_NAME_RE, allow_empty=False,
                           pattern_help=ROLE_NAME_HELP, max_length=64)
        tasks = self.integer(item, "taskNumber", path, required=True, minimum=1, maximum=MAX_TASK_NUMBER)
        cpus = self.integer(item, "cpuNumber", path, required=True, minimum=1, maximum=MAX_CPU_NUMBER)
        memory = self.integer(item, "memoryMB", path, required=True, minimum=100, maximum=MAX_MEMORY_MB, unit=" MB")
        shm = self.integer(item, "shmMB", path, required=False, minimum=0, maximum=MAX_MEMORY_MB,
                           default=V1_DEFAULT_SHM_MB, unit=" MB")
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
        self.v2_only(item, path, V2_ONLY_ROLE_KEYS, "a task role's own image is protocol v2's (taskRoles.<name>."
                     'dockerImage); in a v1 config every task role runs the job\'s "image"')
        extra = self.unknown_keys(item, path, ROLE_FIELDS, (*ROLE_KEPT_FIELDS, *V2_ONLY_ROLE_KEYS))
        if self.problem_count > before or None in (name, tasks, cpus, memory, gpus, command, ports):
            return None
        return TaskRoleSpec(
            name=name, task_number=tasks, cpu_number=cpus, memory_mb=memory,  # type: ignore[arg-type]
            shm_mb=V1_DEFAULT_SHM_MB if shm is None else shm, gpu_number=gpus, ports=tuple(ports),  # type: ignore[arg-type]
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
            if self.gave_up:
                break
            port_path = f"{where}[{index}]"
            if not isinstance(entry, dict):
                self.error(port_path, f"expected an object {{label, beginAt, portNumber}}, got {_describe(entry)}")
                continue
            before = self.problem_count
            label = self.string(entry, "label", port_path, required=True, pattern=LABEL_RE, allow_empty=False,
                                pattern_help=ROLE_NAME_HELP, max_length=64)
            begin = self.integer(entry, "beginAt", port_path, required=True, minimum=0, maximum=65535)
            number = self.integer(entry, "portNumber", port_path, required=True, minimum=1, maximum=MAX_PORT_NUMBER)
            kept = self.unknown_keys(entry, port_path, PORT_FIELDS, ())
            if begin and number and begin + number - 1 > 65535:
                self.error(f"{port_path}.beginAt", f"ports {begin}..{begin + number - 1} go past 65535")
            if label is not None and label in labels:
                self.error(f"{port_path}.label", f'duplicate port label "{label}" (also {where}[{labels[label]}].label); labels must be unique in a task role')
            elif label is not None:
                labels[label] = index
            if self.problem_count == before and label is not None and begin is not None and number is not None:
                ports.append(PortSpec(label=label, begin_at=begin, port_number=number, extra=kept))
        self._fixed_ports_apart(ports, where)
        return ports

    def _fixed_ports_apart(self, ports: list[PortSpec], where: str) -> None:
        """A task cannot take one port twice: such a role could never be
        placed anywhere, and would wait for good."""
        fixed = sorted((p.fixed[0], p.fixed[-1], p.label) for p in ports if p.begin_at)
        for (first, last, label), (next_first, next_last, next_label) in zip(fixed, fixed[1:]):
            if next_first <= last:
                self.error(where, f'fixed ports {next_first}..{next_last} of label "{next_label}" overlap '
                                  f'{first}..{last} of label "{label}"; a task takes each port once')

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
            if not ENV_NAME_RE.fullmatch(key) or len(key) > 128:
                self.error(where, "expected an environment variable name: letters, digits and _, not starting with a digit")
                continue
            if key.startswith("PAI_"):
                self.error(where, "names starting with PAI_ are set by the platform; choose another name")
                continue
            if key in BOOLEAN_ENVS:
                if not isinstance(item, bool):
                    self.error(where, f"expected true or false, got {_describe(item)}")
                    continue
                if key == "paiAzRDMA" and item:
                    self.warn(where, "Azure RDMA devices are not given to containers here; "
                              "the task only sees the variable")
            elif isinstance(item, (dict, list)):
                self.error(where, f"expected a string, number, boolean or null, got {_describe(item)}")
                continue
            if key in PLATFORM_ENVS:
                self.warn(where, PLATFORM_ENVS[key])
            result[key] = item
        return result

    def extras(self, value: dict) -> dict[str, Any] | None:
        extras = value.get("extras")
        if extras is None:
            return {}
        if not isinstance(extras, dict):
            self.error("extras", f"expected an object, got {_describe(extras)}")
            return None
        # Our one key in extras: upload what tasks leave in /pai/output.
        upload = extras.get("uploadOutputs")
        if upload is not None and not isinstance(upload, bool):
            self.error("extras.uploadOutputs", f"expected true or false, got {_describe(upload)}")
            return None
        return extras
