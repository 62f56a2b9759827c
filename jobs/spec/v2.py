"""OpenPAI protocol v2 (YAML), checked and turned into the same JobSpec as v1.

The facts come from OpenPAI's protocol schema (openpai-protocol,
schemas/v2/schema.yaml) and its REST server's checks and rendering: the
fields and which of them are required; task role and port names are C
identifiers; prerequisites are named per type and must exist; a task role's
command is its deployment's preCommands, its commands and its postCommands,
each trimmed, joined with " && ", then rendered and trimmed.

How v2 maps onto a JobSpec:

    name -> job_name            jobRetryCount -> retry_count
    defaults.virtualCluster     taskRoles.<r>.instances -> task_number
    prerequisites dockerimage   resourcePerInstance cpu/memoryMB/gpu,
      uri -> image, auth ->       ports {label: n} -> PortSpec(label, 0, n)
      image_auth                extraContainerOptions.shmMB -> shm_mb
                                  (none or 0: 512, at most memoryMB)
    completion.minFailedInstances / minSucceededInstances (-1: never /
      all; null or 0: the default, 1 / all) -> min_failed/succeeded_task_count
    extras -> extras (kept; hivedScheduler skuType/gpuType -> gpu_type)

Images: each task role runs the dockerimage prerequisite its dockerImage
names. The job's image and image_auth are the first task role's; a role
whose prerequisite differs (in uri or auth) carries its own in
TaskRoleSpec.image and image_auth (the normalized config's roleImage and
roleImageAuth), and only then, so a one-image job is stored as before.

Secrets never enter the JobSpec: commands keep `<% $secrets.x %>` (see
v2_text.py); ParsedConfig.secrets carries the values to be sealed.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from jobs.spec.language import (
    MAX_CPU_NUMBER, MAX_GPU_NUMBER, MAX_MEMORY_MB, MAX_NAME_LENGTH, MAX_PORT_NUMBER, MAX_RETRY_COUNT, MAX_TASK_NUMBER,
    MAX_TASKS_PER_JOB, VC_NAME_RE, JobSpec, PortSpec, TaskRoleSpec,
)
from jobs.spec.v2_text import ROOTS, RenderProblem, as_references, render, secret_leaves
from jobs.spec.validation import _describe, _Validator

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]+\Z")
IDENT_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
SECRET_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+\Z")
PUBLIC_KEY_RE = re.compile(r"(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)"
                           r" [A-Za-z0-9+/]+={0,3}( [^\n]*)?")
PREREQUISITE_TYPES = ("dockerimage", "script", "data", "output")
# Which prerequisite type each task role field names.
ROLE_PREREQUISITES = {"dockerImage": "dockerimage", "script": "script", "data": "data", "output": "output"}

JOB_FIELDS = ("protocolVersion", "name", "type", "version", "contributor", "description", "prerequisites",
              "parameters", "secrets", "jobRetryCount", "taskRoles", "deployments", "defaults", "extras")
PREREQUISITE_FIELDS = ("protocolVersion", "name", "type", "version", "contributor", "description", "uri", "auth")
# A deployment's own fields, and the base fields every protocol item may
# carry (OpenPAI's example gives its deployment a version).
DEPLOYMENT_FIELDS = ("protocolVersion", "name", "version", "contributor", "description", "taskRoles")
ROLE_FIELDS = ("protocolVersion", "instances", "completion", "taskRetryCount", "dockerImage", "data", "output",
               "script", "extraContainerOptions", "resourcePerInstance", "commands")
RESOURCE_FIELDS = ("cpu", "memoryMB", "gpu", "ports")
AUTH_FIELDS = ("username", "password", "registryuri")
KNOWN_EXTRAS = ("submitFrom", "gangAllocation", "hivedScheduler", "com.microsoft.pai.runtimeplugin", "uploadOutputs",
                "gpuType", "jobStatusChangeNotification")
MAX_COMMAND = 64 * 1024
MAX_SECRETS = 100  # (ours) far above real jobs; each is looked for in every command and message
# OpenPAI renders a dockerimage's auth with $secrets and nothing else.
_AUTH_MISSING = {root: "a dockerimage's auth takes <% $secrets.name %> references only" for root in ROOTS}
# What a completion count of null or 0 means, as OpenPAI 1.x reads it.
_UNSET_COMPLETION = {
    "minFailedInstances": "null or 0 is the default here, as in OpenPAI 1.x: the job fails when 1 task fails; "
                          "write -1 for task failures never to fail the job",
    "minSucceededInstances": "0 is the default here, as in OpenPAI 1.x: the job succeeds when all its tasks "
                             "have completed (as -1)",
}
# OpenPAI's /dev/shm for a v2 task role that gives no shmMB (or 0): both its
# launchers (rest-server models/v2/job/k8s.js and yarn.js) use 512 MB, not
# v1's 64. PyTorch's DataLoader workers, common in v2 configs, need it.
DEFAULT_SHM_MB = 512


class V2Validator(_Validator):
    """The v1 validator's reporting and typed getters, with v2's fields."""

    def __init__(self, positions: Any, *, user_name: str, default_fs_uri: str) -> None:
        super().__init__(positions)
        self.user_name = user_name
        self.default_fs_uri = default_fs_uri

    # -- helpers

    def refuse_unknown(self, obj: dict, path: str, known: tuple[str, ...], what: str) -> None:
        for key in obj:
            if key not in known:
                where = f"{path}.{key}" if path else key
                self.error(where, f'unknown field "{key}": {what} takes {", ".join(known)}')

    def mapping(self, obj: dict, key: str, path: str, *, required: bool = False) -> dict | None:
        where = f"{path}.{key}" if path else key
        if obj.get(key) is None:
            if required:
                self.error(where, "is required")
            return None
        if not isinstance(obj[key], dict):
            self.error(where, f"expected a mapping (key: value lines), got {_describe(obj[key])}")
            return None
        return obj[key]

    def string_list(self, obj: dict, key: str, path: str, *, required: bool) -> list[str] | None:
        where = f"{path}.{key}" if path else key
        value = obj.get(key)
        if value is None:
            if required:
                self.error(where, "is required: a list of shell commands")
            return None
        if not isinstance(value, list) or not value:
            self.error(where, f"expected a list of at least one string, got {_describe(value)}")
            return None
        bad = [index for index, item in enumerate(value) if not isinstance(item, str)]
        for index in bad:
            self.error(f"{where}[{index}]", f"expected a string, got {_describe(value[index])}")
        return None if bad else value

    # -- the job

    def job(self, value: Any, **_: Any) -> tuple[JobSpec | None, dict[str, Any]]:  # type: ignore[override]
        if not isinstance(value, dict):
            self.error("", f"expected a mapping with protocolVersion, name, type, prerequisites and taskRoles, "
                           f"got {_describe(value)}")
            return None, {}
        self.refuse_unknown(value, "", JOB_FIELDS, "a v2 job")
        if value.get("protocolVersion") not in (2, "2"):
            self.error("protocolVersion", f"expected 2, got {_describe(value.get('protocolVersion'))}"
                       if "protocolVersion" in value else "is required: 2")
        if value.get("type") != "job":
            self.error("type", f'expected "job", got {_describe(value.get("type"))}' if "type" in value
                       else 'is required: "job"')
        name = self.string(value, "name", "", required=True, pattern=NAME_RE, allow_empty=False,
                           pattern_help="letters, digits, _ and - (pattern ^[a-zA-Z0-9_-]+$)", max_length=MAX_NAME_LENGTH)
        for key in ("contributor", "description"):
            self.string(value, key, "", required=False, max_length=64 * 1024)
        if not isinstance(value.get("version", ""), (str, int, float)) or isinstance(value.get("version"), bool):
            self.error("version", f"expected a string or number, got {_describe(value['version'])}")
        retry = self.integer(value, "jobRetryCount", "", required=False, minimum=0, maximum=MAX_RETRY_COUNT, default=0)
        parameters = self.mapping(value, "parameters", "") or {}
        secrets = self.secrets(value)
        if len(secret_leaves(secrets)) > MAX_SECRETS:
            # Checked no further: every command, auth and message is matched
            # against every secret, and the size limit held 10,000 of them.
            self.error("secrets", f"expected at most {MAX_SECRETS} secrets")
            return None, secrets
        prerequisites = self.prerequisites(value, secrets)
        defaults = self.defaults(value)
        deployment = self.deployment(value, defaults.get("deployment"))
        roles = self.task_roles(value, prerequisites, parameters, secrets, deployment)
        extras, gpu_type = self.extras(value)
        image, auth, specs = self.images(roles, prerequisites)
        if self.problem_count or name is None or not roles or image is None or extras is None:
            return None, secrets
        return JobSpec(
            job_name=name, image=image, auth_file=None, data_dir=None,
            output_dir=f"{self.default_fs_uri.rstrip('/')}/Output/{self.user_name}/{name}", code_dir=None,
            virtual_cluster=defaults.get("virtualCluster") or "default", task_roles=tuple(specs),
            gpu_type=gpu_type, retry_count=retry or 0, kill_all_on_completed_task_number=None, job_envs={},
            extras=extras, image_auth=auth,
        ), secrets

    def secrets(self, value: dict) -> dict[str, Any]:
        secrets = self.mapping(value, "secrets", "") or {}

        def check(item: Any, path: str) -> None:
            if isinstance(item, dict):
                for key, inner in item.items():
                    if not SECRET_NAME_RE.fullmatch(str(key)):
                        self.error(f"{path}.{key}", "expected a name of letters, digits, _ and -")
                    check(inner, f"{path}.{key}")
            elif isinstance(item, list):
                self.error(path, "expected a single value or a mapping, got a list")  # never quote a secret

        check(secrets, "secrets")
        return secrets

    def prerequisites(self, value: dict, secrets: dict) -> dict[str, dict[str, dict]]:
        found: dict[str, dict[str, dict]] = {kind: {} for kind in PREREQUISITE_TYPES}
        items = value.get("prerequisites")
        if items is None:
            self.error("prerequisites", "is required: a list with at least the dockerimage the task roles run")
            return found
        if not isinstance(items, list) or not items:
            self.error("prerequisites", f"expected a list of at least one prerequisite, got {_describe(items)}")
            return found
        for index, item in enumerate(items):
            path = f"prerequisites[{index}]"
            if not isinstance(item, dict):
                self.error(path, f"expected a mapping with name, type and uri, got {_describe(item)}")
                continue
            checked = self.prerequisite(item, path, secrets)
            if checked is None:
                continue
            kind, name, item = checked
            if name in found[kind]:
                self.error(f"{path}.name", f'duplicate {kind} prerequisite "{name}"')
            found[kind][name] = item
        return found

    def prerequisite(self, item: dict, path: str, secrets: dict) -> tuple[str, str, dict] | None:
        """(type, name, the prerequisite with its auth rendered), or None."""
        if "plugin" in item or "callbacks" in item:
            self.error(path, "runtime-plugin prerequisites (plugin, callbacks) are not supported here; "
                             "put the commands in deployments or the task role's commands")
            return None
        self.refuse_unknown(item, path, PREREQUISITE_FIELDS, "a prerequisite")
        kind = item.get("type")
        if kind not in PREREQUISITE_TYPES:
            self.error(f"{path}.type", f"expected one of {', '.join(PREREQUISITE_TYPES)}, got {_describe(kind)}")
            return None
        name = self.string(item, "name", path, required=True, pattern=NAME_RE, allow_empty=False,
                           pattern_help="letters, digits, _ and -", max_length=255)
        if kind == "data":
            uri = item.get("uri")
            if not isinstance(uri, list) or not uri or not all(isinstance(u, str) for u in uri):
                self.error(f"{path}.uri", f"expected a list of at least one URI, got {_describe(uri)}")
        else:
            self.string(item, "uri", path, required=True, allow_empty=False, max_length=2048,
                        pattern=re.compile(r"^\S+\Z") if kind == "dockerimage" else None,
                        pattern_help="a Docker image name without spaces, like busybox:latest")
        if "auth" in item:
            auth = self.auth(item, path, kind, secrets)
            item = item if auth is None else {**item, "auth": auth}
        return (kind, name, item) if name is not None else None

    def auth(self, item: dict, path: str, kind: str, secrets: dict) -> dict[str, str] | None:
        """A dockerimage's auth rendered as OpenPAI renders it (rest-server
        middlewares/v2/protocol.js): every field with `$secrets` only, each
        secret kept as its reference until the node pulls the image."""
        where = f"{path}.auth"
        if kind != "dockerimage":
            self.error(where, "only a dockerimage prerequisite takes auth")
            return None
        auth = self.mapping(item, "auth", path)
        if auth is None:
            return None
        self.refuse_unknown(auth, where, AUTH_FIELDS, "auth")
        rendered: dict[str, str] = {}
        for key in AUTH_FIELDS:
            text = self.string(auth, key, where, required=False, max_length=1024)
            try:
                if text is not None:
                    rendered[key] = render(text, {"secrets": secrets}, missing=_AUTH_MISSING).strip()
            except RenderProblem as exc:
                self.error(f"{where}.{key}", str(exc))
        password = auth.get("password")
        if isinstance(password, str) and password.strip() and not re.fullmatch(r"\s*<%\s*\$secrets\.[^%]+%>\s*", password):
            # Never quoted: this may be the password itself.
            self.error(f"{where}.password", "expected a reference to a secret, like <% $secrets.registry_password %>, "
                                            "so that the password is never stored or shown")
        return rendered

    def defaults(self, value: dict) -> dict[str, Any]:
        defaults = self.mapping(value, "defaults", "") or {}
        for key in defaults:
            if key not in ("virtualCluster", "deployment"):
                self.warn(f"defaults.{key}", f'unknown field "{key}" is not used (defaults takes virtualCluster '
                                             "and deployment)")
        vc = self.string(defaults, "virtualCluster", "defaults", required=False, pattern=VC_NAME_RE,
                         pattern_help="letters, digits and _ (pattern ^[A-Za-z0-9_]+$)", max_length=64)
        deployment = self.string(defaults, "deployment", "defaults", required=False, max_length=255)
        return {"virtualCluster": vc, "deployment": deployment}

    def deployment(self, value: dict, chosen: str | None) -> tuple[str, dict] | None:
        """The deployment defaults.deployment names, as (its path, it)."""
        items = value.get("deployments")
        named: dict[str, tuple[str, dict]] = {}
        if items is not None and (not isinstance(items, list) or not items):
            self.error("deployments", f"expected a list of at least one deployment, got {_describe(items)}")
            items = []
        for index, item in enumerate(items or []):
            path = f"deployments[{index}]"
            if not isinstance(item, dict):
                self.error(path, f"expected a mapping with name and taskRoles, got {_describe(item)}")
                continue
            self.deployment_fields(item, path)
            name = self.string(item, "name", path, required=True, pattern=NAME_RE, allow_empty=False,
                               pattern_help="letters, digits, _ and -", max_length=255)
            self.deployment_roles(item, path, value.get("taskRoles"))
            if name is not None and name in named:
                self.error(f"{path}.name", f'duplicate deployment "{name}" (also {named[name][0]})')
            elif name is not None:
                named[name] = (path, item)
        if chosen is None:
            if named:
                self.warn("deployments", "no deployment is used: defaults.deployment names none")
            return None
        if chosen not in named:
            known = ", ".join(named) or "none"
            self.error("defaults.deployment", f'deployment "{chosen}" does not exist; deployments: {known}')
            return None
        return named[chosen]

    def deployment_fields(self, item: dict, path: str) -> None:
        """OpenPAI's schema takes any field on a deployment besides its own,
        unchecked, so an unknown one is warned about here, not refused."""
        for key in item:
            if key not in DEPLOYMENT_FIELDS:
                self.warn(f"{path}.{key}", f'unknown field "{key}" is not used (a deployment takes '
                                           f'{", ".join(DEPLOYMENT_FIELDS)})')

    def deployment_roles(self, item: dict, path: str, task_roles: Any) -> None:
        roles = self.mapping(item, "taskRoles", path, required=True)
        for role, hooks in (roles or {}).items():
            where = f"{path}.taskRoles.{role}"
            if not IDENT_RE.fullmatch(role):
                self.error(where, "a task role's name is letters, digits and _, not starting with a digit "
                                  "(pattern ^[a-zA-Z_][a-zA-Z0-9_]*$)")
            elif isinstance(task_roles, dict) and role not in task_roles:
                # OpenPAI takes it and uses a deployment's entries for the
                # task roles the job has only (middlewares/v2/protocol.js).
                self.warn(where, f'task role "{role}" is not in taskRoles, so these commands are not used')
            if not isinstance(hooks, dict):
                self.error(where, f"expected a mapping with preCommands and postCommands, got {_describe(hooks)}")
                continue
            self.refuse_unknown(hooks, where, ("preCommands", "postCommands"), "a deployment's task role")
            for key in ("preCommands", "postCommands"):
                self.string_list(hooks, key, where, required=False)

    def task_roles(self, value: dict, prerequisites: dict, parameters: dict, secrets: dict,
                   deployment: tuple[str, dict] | None) -> dict[str, tuple[TaskRoleSpec, str]]:
        roles = self.mapping(value, "taskRoles", "", required=True)
        if roles is not None and not roles:
            self.error("taskRoles", "expected at least one task role")
        built: dict[str, tuple[TaskRoleSpec, str]] = {}
        for name, role in (roles or {}).items():
            if self.gave_up:
                break
            path = f"taskRoles.{name}"
            if not IDENT_RE.fullmatch(name) or len(name) > 64:
                self.error(path, "a task role's name is letters, digits and _, not starting with a digit "
                                          "(pattern ^[a-zA-Z_][a-zA-Z0-9_]*$), at most 64 characters")
                continue
            if not isinstance(role, dict):
                self.error(path, f"expected a mapping with dockerImage, resourcePerInstance and commands, got "
                                 f"{_describe(role)}")
                continue
            hooks = (_deployed_roles(deployment).get(name), f"{deployment[0]}.taskRoles.{name}") \
                if deployment else (None, "")
            spec = self.task_role(name, role, path, prerequisites, parameters, secrets, hooks)
            if spec is not None:
                built[name] = (spec, role.get("dockerImage"))
        total = sum(spec.task_number for spec, _ in built.values())
        if total > MAX_TASKS_PER_JOB:
            self.error("taskRoles", f"expected at most {MAX_TASKS_PER_JOB} tasks in a job, got {total}")
        return built

    def task_role(self, name: str, role: dict, path: str, prerequisites: dict, parameters: dict, secrets: dict,
                  hooks: tuple[Any, str]) -> TaskRoleSpec | None:
        before = self.problem_count
        self.refuse_unknown(role, path, ROLE_FIELDS, "a task role")
        instances = self.integer(role, "instances", path, required=False, minimum=1, maximum=MAX_TASK_NUMBER, default=1)
        failed, succeeded = self.completion(role, path, instances or 1)
        retry = self.integer(role, "taskRetryCount", path, required=False, minimum=0, maximum=MAX_RETRY_COUNT, default=0)
        if retry:
            self.warn(f"{path}.taskRetryCount", "tasks are not retried one by one here; the whole job is retried "
                                                "(jobRetryCount)")
        chosen = self.role_prerequisites(role, path, prerequisites)
        shm = self.container_options(role, path)
        resources = self.resources(role, path)
        command = self.command(role, path, chosen, parameters, secrets, hooks)
        if self.problem_count > before or resources is None or command is None or instances is None:
            return None
        cpu, memory, gpu, ports = resources
        if shm is None:
            shm = default_shm_mb(memory)
        elif shm > memory:
            self.error(f"{path}.extraContainerOptions.shmMB", f"expected at most memoryMB ({memory}), got {shm}")
            return None
        return TaskRoleSpec(name=name, task_number=instances, cpu_number=cpu, memory_mb=memory, shm_mb=shm,
                            gpu_number=gpu, ports=ports, command=command, min_failed_task_count=failed,
                            min_succeeded_task_count=succeeded)

    def completion(self, role: dict, path: str, instances: int) -> tuple[int | None, int | None]:
        completion = self.mapping(role, "completion", path) or {}
        where = f"{path}.completion"
        self.refuse_unknown(completion, where, ("minFailedInstances", "minSucceededInstances"), "completion")
        counts: list[int | None] = []
        for key, default in (("minFailedInstances", 1), ("minSucceededInstances", None)):
            number = self.integer(completion, key, where, required=False, minimum=-1, maximum=MAX_TASK_NUMBER,
                                  default=default, nullable=True)
            if key in completion and (completion[key] is None or number == 0):
                # OpenPAI 1.x (k8s.js) takes null and 0 for "not given"; its
                # YARN launcher and v1 read a null minFailed as "never".
                if key == "minFailedInstances" or number == 0:  # a null minSucceeded is "all" either way
                    self.warn(f"{where}.{key}", _UNSET_COMPLETION[key])
                number = default
            elif number is not None and number > instances:
                self.error(f"{where}.{key}", f"expected -1 or between 1 and instances ({instances}), got {number}")
            counts.append(None if number == -1 else number)
        return counts[0], counts[1]

    def role_prerequisites(self, role: dict, path: str, prerequisites: dict) -> dict[str, dict | None]:
        chosen: dict[str, dict | None] = {}
        for field, kind in ROLE_PREREQUISITES.items():
            ref = self.string(role, field, path, required=field == "dockerImage", allow_empty=False, max_length=255,
                              pattern_help=f"the name of a {kind} prerequisite")
            if ref is not None and ref not in prerequisites[kind]:
                known = ", ".join(prerequisites[kind]) or "none"
                self.error(f"{path}.{field}", f'names {kind} prerequisite "{ref}", which does not exist; '
                                              f"{kind} prerequisites: {known}")
            chosen[kind] = prerequisites[kind].get(ref) if ref else None
        return chosen

    def container_options(self, role: dict, path: str) -> int | None:
        """The role's shmMB, or None for OpenPAI's default (none given, or 0,
        which OpenPAI's launchers also read as "the default")."""
        options = self.mapping(role, "extraContainerOptions", path) or {}
        where = f"{path}.extraContainerOptions"
        for key, item in options.items():
            if key == "infiniband":
                if item is True:
                    self.warn(f"{where}.infiniband", "InfiniBand devices are not given to containers here; ignored")
                elif not isinstance(item, bool):
                    self.error(f"{where}.infiniband", f"expected true or false, got {_describe(item)}")
            elif key != "shmMB":
                self.error(f"{where}.{key}", f'"{key}" is not supported; extraContainerOptions takes shmMB '
                                             "(and infiniband, ignored)")
        shm = self.integer(options, "shmMB", where, required=False, minimum=0, maximum=MAX_MEMORY_MB, unit=" MB")
        return shm or None

    def resources(self, role: dict, path: str) -> tuple[int, int, int, tuple[PortSpec, ...]] | None:
        resources = self.mapping(role, "resourcePerInstance", path, required=True)
        if resources is None:
            return None
        where = f"{path}.resourcePerInstance"
        self.refuse_unknown(resources, where, RESOURCE_FIELDS, "resourcePerInstance")
        cpu = self.integer(resources, "cpu", where, required=True, minimum=1, maximum=MAX_CPU_NUMBER)
        memory = self.integer(resources, "memoryMB", where, required=True, minimum=100, maximum=MAX_MEMORY_MB, unit=" MB")
        gpu = self.integer(resources, "gpu", where, required=True, minimum=0, maximum=MAX_GPU_NUMBER)
        ports: list[PortSpec] = []
        for label, count in (self.mapping(resources, "ports", where) or {}).items():
            if not IDENT_RE.fullmatch(label) or len(label) > 64:
                self.error(f"{where}.ports.{label}", "a port label is letters, digits and _, not starting with a "
                                                         "digit (pattern ^[a-zA-Z_][a-zA-Z0-9_]*$)")
                continue
            number = self.integer(resources["ports"], label, f"{where}.ports", required=True, minimum=1,
                                  maximum=MAX_PORT_NUMBER)
            if number is not None:
                ports.append(PortSpec(label=label, begin_at=0, port_number=number))
        if None in (cpu, memory, gpu):
            return None
        return cpu, memory, gpu, tuple(ports)  # type: ignore[return-value]

    def command(self, role: dict, path: str, chosen: dict, parameters: dict, secrets: dict,
                hooks: tuple[Any, str]) -> str | None:
        """preCommands, commands, postCommands: each trimmed, joined with &&,
        each rendered (problems name the line they are in), then trimmed."""
        commands = self.string_list(role, "commands", path, required=True)
        if commands is None:
            return None
        lines = [(f"{path}.commands[{index}]", text) for index, text in enumerate(commands)]
        deployed, deployed_path = hooks
        if isinstance(deployed, dict):
            def hook(key: str) -> list[tuple[str, str]]:
                extra = deployed.get(key)
                if not isinstance(extra, list) or not all(isinstance(item, str) for item in extra):
                    return []  # reported by deployment_roles
                return [(f"{deployed_path}.{key}[{i}]", text) for i, text in enumerate(extra)]

            lines = hook("preCommands") + lines + hook("postCommands")
        context = {"parameters": parameters, "secrets": secrets, "script": chosen["script"], "data": chosen["data"],
                   "output": chosen["output"]}
        missing = {"parameters": "there are no parameters", "secrets": "there are no secrets",
                   **{kind: f"the task role names no {kind} prerequisite ({path}.{kind})"
                      for kind in ("script", "data", "output")}}
        rendered: list[str] = []
        for where, text in lines:
            try:
                rendered.append(render(text.strip(), context, missing=missing, max_length=MAX_COMMAND))
            except RenderProblem as exc:
                self.error(where, str(exc))
        if len(rendered) < len(lines):
            return None
        command = as_references(" && ".join(rendered).strip(), secrets)
        if not command:
            self.error(f"{path}.commands", "the commands are empty")
            return None
        if len(command) > MAX_COMMAND:
            self.error(f"{path}.commands", f"expected at most {MAX_COMMAND} characters in all, got {len(command)}")
            return None
        return command

    def images(self, roles: dict[str, tuple[TaskRoleSpec, str]],
               prerequisites: dict) -> tuple[str | None, dict | None, list[TaskRoleSpec]]:
        """The job's image and registry credentials (its first task role's),
        and the task roles, each with its own where they differ."""
        images = {name: _image_of(prerequisites["dockerimage"][ref]) for name, (_, ref) in roles.items()
                  if ref in prerequisites["dockerimage"]}
        if not images or len(images) < len(roles):
            return None, None, []  # a role's dockerImage names nothing: reported by role_prerequisites
        first = next(iter(images.values()))
        specs = [spec if images[name] == first else replace(spec, image=images[name][0], image_auth=images[name][1])
                 for name, (spec, _) in roles.items()]
        return first[0], first[1], specs

    def extras(self, value: dict) -> tuple[dict[str, Any] | None, str | None]:
        extras = self.mapping(value, "extras", "")
        if extras is None:
            return ({} if value.get("extras") is None else None), None
        for key in extras:
            if key not in KNOWN_EXTRAS:
                self.warn(f"extras.{key}", f'extras.{key} is kept with the job but not used here')
        if extras.get("gangAllocation") is False:
            self.warn("extras.gangAllocation", "jobs here are always gang-scheduled (all tasks start together)")
        upload = extras.get("uploadOutputs")
        if upload is not None and not isinstance(upload, bool):
            self.error("extras.uploadOutputs", f"expected true or false, got {_describe(upload)}")
        self.runtime_plugins(extras.get("com.microsoft.pai.runtimeplugin"))
        self.hived_scheduler(extras.get("hivedScheduler"), value.get("taskRoles"))
        return extras, self.gpu_type(extras)

    def hived_scheduler(self, hived: Any, task_roles: Any) -> None:
        """What OpenPAI's hived scheduler refuses (rest-server
        middlewares/v2/hived.js) that would mean something here: its per-role
        skuType becomes the job's GPU type, so it must name a task role."""
        where = "extras.hivedScheduler"
        if hived is None:
            return
        if not isinstance(hived, dict):
            self.error(where, f"expected a mapping with taskRoles, got {_describe(hived)}")
            return
        if "jobPriorityClass" in hived:
            self.warn(f"{where}.jobPriorityClass", "jobs here have no priority classes; ignored")
        roles = hived.get("taskRoles")
        if not isinstance(roles, dict) or not isinstance(task_roles, dict):
            return
        for role in roles:
            if role not in task_roles:
                known = ", ".join(task_roles) or "none"
                self.error(f"{where}.taskRoles.{role}", f'task role "{role}" is not in taskRoles; task roles: {known}')

    def runtime_plugins(self, plugins: Any) -> None:
        where = "extras.com.microsoft.pai.runtimeplugin"
        if plugins is None:
            return
        if not isinstance(plugins, list):
            self.error(where, f"expected a list of plugins, got {_describe(plugins)}")
            return
        for index, plugin in enumerate(plugins):
            name = plugin.get("plugin") if isinstance(plugin, dict) else None
            if name == "ssh":
                self.userssh(plugin.get("parameters"), f"{where}[{index}].parameters")
            elif isinstance(name, str):
                self.warn(f"{where}[{index}]", f'the runtime plugin "{name}" is not available here and is ignored '
                                               '(of OpenPAI\'s plugins, only "ssh" is)')
            else:
                self.warn(f"{where}[{index}]", "expected {plugin: <name>, parameters: ...}; ignored")

    def userssh(self, parameters: Any, where: str) -> None:
        """The ssh plugin's `userssh: {type: custom, value: <public key>}`:
        authorized in every task of the job, beside the Profile's keys."""
        userssh = parameters.get("userssh") if isinstance(parameters, dict) else None
        if not userssh:
            return
        if not isinstance(userssh, dict) or userssh.get("type", "custom") != "custom":
            self.error(f"{where}.userssh", 'expected {type: custom, value: "<an OpenSSH public key>"}')
            return
        value = userssh.get("value")
        if value is None or (isinstance(value, str) and not value.strip()):
            # OpenPAI's ssh plugin (kube-runtime plugins/ssh/init.py) skips a
            # userssh without a value instead of failing the job.
            self.warn(f"{where}.userssh", "has no value, so no key of it is authorized; "
                                          'give value: "<an OpenSSH public key>"')
            return
        keys = value.strip().splitlines() if isinstance(value, str) else []
        if not keys or not all(PUBLIC_KEY_RE.fullmatch(key.strip()) for key in keys):
            self.error(f"{where}.userssh.value", "expected OpenSSH public keys, one per line, like "
                                                 '"ssh-ed25519 AAAA... you@laptop"')

    def gpu_type(self, extras: dict) -> str | None:
        """extras.gpuType (ours), or hived's per-role skuType/gpuType: one type."""
        found: dict[str, str] = {}
        if isinstance(extras.get("gpuType"), str):
            found["extras.gpuType"] = extras["gpuType"]
        hived = extras.get("hivedScheduler")
        roles = hived.get("taskRoles") if isinstance(hived, dict) else None
        for role, item in (roles or {}).items() if isinstance(roles, dict) else ():
            for key in ("skuType", "gpuType"):
                if isinstance(item, dict) and isinstance(item.get(key), str):
                    found[f"extras.hivedScheduler.taskRoles.{role}.{key}"] = item[key]
        kinds = set(found.values())
        if len(kinds) > 1:
            self.error(next(iter(found)), "a job asks for one GPU type here; got " +
                       ", ".join(f"{kind} ({where})" for where, kind in found.items()))
            return None
        kind = kinds.pop() if kinds else None
        if kind is not None and not re.fullmatch(r"[A-Za-z0-9\-._]{1,64}", kind):
            self.error(next(iter(found)), f"expected a GPU type name like V100, got {_describe(kind)}")
            return None
        return kind



def default_shm_mb(memory_mb: int) -> int:
    """/dev/shm of a v2 task role without shmMB: OpenPAI's DEFAULT_SHM_MB,
    but (ours) never more than the role's memory, so that a small role is
    not refused for a size it did not ask for."""
    return min(DEFAULT_SHM_MB, memory_mb)


def _deployed_roles(deployment: tuple[str, dict]) -> dict:
    """The chosen deployment's entries by task role; {} when its taskRoles is
    no mapping (deployment_roles reports that)."""
    roles = deployment[1].get("taskRoles")
    return roles if isinstance(roles, dict) else {}


def _image_of(item: dict) -> tuple[str, dict[str, str] | None]:
    """A dockerimage prerequisite's uri, and its auth as `V2Validator.auth`
    rendered it (secrets as references, v2_text.secret_ref)."""
    auth = item.get("auth") if isinstance(item.get("auth"), dict) else None
    if auth:
        auth = {"registry": auth.get("registryuri", ""), "username": auth.get("username", ""),
                "password": auth.get("password", "")}
    return item.get("uri"), auth  # type: ignore[return-value]


def plugin_ssh_keys(extras: dict[str, Any]) -> list[str]:
    """The public keys a job's ssh runtime plugin asks to authorize
    (`extras.com.microsoft.pai.runtimeplugin[].parameters.userssh.value`),
    as checked at submission."""
    keys: list[str] = []
    for plugin in extras.get("com.microsoft.pai.runtimeplugin") or ():
        parameters = plugin.get("parameters") if isinstance(plugin, dict) and plugin.get("plugin") == "ssh" else None
        userssh = parameters.get("userssh") if isinstance(parameters, dict) else None
        value = userssh.get("value") if isinstance(userssh, dict) else None
        if isinstance(value, str):
            keys += [key.strip() for key in value.strip().splitlines() if PUBLIC_KEY_RE.fullmatch(key.strip())]
    return keys
