"""Between the two protocols, for Submit Job's form and its Export.

The form's fields are v1's (jobName, image, taskRoles[i].cpuNumber ...). A
v2 config is shown in them only when every part of it has a field there (or
is one of the kept top-level notes: version, contributor, description);
otherwise `v2_as_form` says, in words, what it uses that the form has not,
and the page keeps the config as YAML text. Nothing is dropped on either way
across: what does not fit is named, never left behind. Conversions check no
field (the parser does, on the text they produce). Pure: no Django, no I/O.

    v2 (a representable one)            the form's fields (v1)
    name                                jobName
    prerequisites: one dockerimage      image
    defaults.virtualCluster             virtualCluster
    extras.gpuType                      gpuType
    jobRetryCount                       retryCount
    taskRoles.<r>.instances             taskRoles[i].taskNumber (name: r)
      resourcePerInstance cpu/memoryMB/gpu   cpuNumber/memoryMB/gpuNumber
      resourcePerInstance.ports {l: n}  portList [{label: l, beginAt: 0, portNumber: n}]
      extraContainerOptions.shmMB       shmMB
      commands [a, b]                   command "a && b" (how v2 runs them)
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from jobs.spec.language import V1_DEFAULT_SHM_MB
from jobs.spec.v2 import IDENT_RE, NAME_RE, default_shm_mb

IMAGE_PREREQUISITE = "image"  # (ours) the dockerimage prerequisite's name in a v2 config made from the form
V2_NOTES = ("version", "contributor", "description")  # kept as they are, both ways
_V2_TOP = ("protocolVersion", "name", "type", "prerequisites", "jobRetryCount", "taskRoles", "defaults", "extras",
           *V2_NOTES)
_V2_ROLE = ("instances", "dockerImage", "resourcePerInstance", "commands", "extraContainerOptions")
_V1_TOP = ("jobName", "image", "virtualCluster", "gpuType", "retryCount", "taskRoles", "extras", *V2_NOTES)
_V1_ROLE = ("name", "taskNumber", "cpuNumber", "memoryMB", "gpuNumber", "shmMB", "portList", "command")
_WORDS = {
    "deployments": "deployments", "parameters": "parameters", "secrets": "secrets",
    "defaults.deployment": "a default deployment", "completion": "completion policies",
    "taskRetryCount": "task retries (taskRetryCount)", "script": "script, data or output prerequisites",
    "data": "script, data or output prerequisites", "output": "script, data or output prerequisites",
}


def _phrase(items: list[str]) -> str:
    items = list(dict.fromkeys(items))
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def form_blocker_message(uses: list[str]) -> str:
    return (f"this v2 config uses {_phrase(uses)}, which the form cannot show; edit it as YAML "
            "(the JSON / YAML button)")


# --------------------------------------------------------------- v2 -> form


def v2_as_form(value: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """(the form's v1-shaped config, []) for a v2 config the form can show,
    else (None, what it uses that the form cannot show)."""
    if not isinstance(value, dict):
        return None, ["something other than a mapping"]
    uses = [_WORDS.get(key, f'the field "{key}"') for key in value if key not in _V2_TOP]
    defaults = value.get("defaults") if isinstance(value.get("defaults"), dict) else {}
    uses += [_WORDS.get(f"defaults.{k}", f'"defaults.{k}"') for k in defaults if k != "virtualCluster"]
    image, image_uses = _one_image(value.get("prerequisites"))
    uses += image_uses
    roles = value.get("taskRoles")
    if not isinstance(roles, dict):
        uses.append("task roles that are not a mapping")
        roles = {}
    form_roles = []
    for name, role in roles.items():
        converted, role_uses = _role_as_form(name, role)
        uses += role_uses
        form_roles.append(converted)
    extras = value.get("extras")
    if extras is not None and not isinstance(extras, dict):
        uses.append("extras that are not a mapping")
    if uses:
        return None, list(dict.fromkeys(uses))
    config: dict[str, Any] = {"jobName": value.get("name"), "image": image}
    if defaults.get("virtualCluster") is not None:
        config["virtualCluster"] = defaults["virtualCluster"]
    extras = dict(extras or {})
    if "gpuType" in extras:
        config["gpuType"] = extras.pop("gpuType")
    if "jobRetryCount" in value:
        config["retryCount"] = value["jobRetryCount"]
    config["taskRoles"] = form_roles
    if extras:
        config["extras"] = extras
    config.update({key: value[key] for key in V2_NOTES if key in value})
    return config, []


def _one_image(prerequisites: Any) -> tuple[Any, list[str]]:
    if not isinstance(prerequisites, list) or len(prerequisites) != 1 or not isinstance(prerequisites[0], dict):
        kinds = [p.get("type") for p in prerequisites or [] if isinstance(p, dict)] \
            if isinstance(prerequisites, list) else []
        if any(kind != "dockerimage" for kind in kinds):
            return None, ["script, data or output prerequisites"]
        if len(kinds) > 1:
            return None, ["several Docker images"]
        return None, ["other than exactly one docker image prerequisite"]
    item = prerequisites[0]
    uses = [f'"prerequisites[0].{key}"' for key in item if key not in ("name", "type", "uri", "auth")]
    if "auth" in item:
        uses.append("a registry login (prerequisite auth)")
    if item.get("type") != "dockerimage":
        uses.append("script, data or output prerequisites")
    return item.get("uri"), uses


def _role_as_form(name: str, role: Any) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(role, dict):
        return {}, [f'a task role "{name}" that is not a mapping']
    uses = [_WORDS.get(key, f'"taskRoles.{name}.{key}"') for key in role if key not in _V2_ROLE]
    converted: dict[str, Any] = {"name": name, "taskNumber": role.get("instances", 1)}
    resources = role.get("resourcePerInstance")
    if isinstance(resources, dict):
        uses += [f'"taskRoles.{name}.resourcePerInstance.{k}"' for k in resources
                 if k not in ("cpu", "memoryMB", "gpu", "ports")]
        for v2_key, v1_key in (("cpu", "cpuNumber"), ("memoryMB", "memoryMB"), ("gpu", "gpuNumber")):
            if v2_key in resources:
                converted[v1_key] = resources[v2_key]
        ports = resources.get("ports")
        if isinstance(ports, dict):
            converted["portList"] = [{"label": label, "beginAt": 0, "portNumber": count} for label, count in ports.items()]
        elif ports is not None:
            uses.append(f'"taskRoles.{name}.resourcePerInstance.ports" that are not a mapping')
    elif resources is not None:
        uses.append(f'"taskRoles.{name}.resourcePerInstance" that is not a mapping')
    options = role.get("extraContainerOptions")
    if isinstance(options, dict):
        uses += [f'"taskRoles.{name}.extraContainerOptions.{k}"' for k in options if k != "shmMB"]
        if "shmMB" in options:
            converted["shmMB"] = options["shmMB"]
    elif options is not None:
        uses.append(f'"taskRoles.{name}.extraContainerOptions" that is not a mapping')
    commands = role.get("commands")
    if isinstance(commands, list) and all(isinstance(c, str) for c in commands):
        if any("<%" in c for c in commands):
            uses.append("<% $... %> references in commands")
        converted["command"] = " && ".join(c.strip() for c in commands)
    elif commands is not None:
        uses.append(f'"taskRoles.{name}.commands" that are not a list of strings')
    return converted, uses


# --------------------------------------------------------------- form -> v2


def form_as_v2(config: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """(a v2 config, []) for a v1-shaped one v2 can say, else (None, the
    v1 fields it cannot)."""
    if not isinstance(config, dict):
        return None, ["something other than an object"]
    cannot = [key for key, item in config.items() if key not in _V1_TOP and item not in (None, "", {}, [])]
    name = config.get("jobName")
    if isinstance(name, str) and name and not NAME_RE.fullmatch(name):
        cannot.append(f"jobName {name!r} (a v2 name is letters, digits, _ and - only)")
    roles = config.get("taskRoles")
    if not isinstance(roles, list):
        return None, cannot + ["taskRoles that are not a list"]
    v2_roles: dict[str, Any] = {}
    for index, role in enumerate(roles):
        converted, role_cannot = _role_as_v2(index, role)
        cannot += role_cannot
        name = role.get("name") if isinstance(role, dict) else None
        if not isinstance(name, str):
            continue  # named in role_cannot
        if name in v2_roles:  # a v2 mapping would keep only the last of them
            cannot.append(f'taskRoles[{index}].name (a second task role named "{name}")')
        v2_roles[name] = converted
    extras = config.get("extras")
    if extras in (None, "", []):
        extras = {}
    elif not isinstance(extras, dict):
        cannot.append("extras (not an object)")
    if cannot:
        return None, list(dict.fromkeys(cannot))
    value: dict[str, Any] = {"protocolVersion": 2, "name": config.get("jobName"), "type": "job"}
    value.update({key: config[key] for key in V2_NOTES if key in config})
    value["prerequisites"] = [{"name": IMAGE_PREREQUISITE, "type": "dockerimage", "uri": config.get("image")}]
    if config.get("retryCount") not in (None, ""):
        value["jobRetryCount"] = config["retryCount"]
    value["taskRoles"] = v2_roles
    if config.get("virtualCluster"):
        value["defaults"] = {"virtualCluster": config["virtualCluster"]}
    extras = dict(extras)
    if config.get("gpuType"):
        extras["gpuType"] = config["gpuType"]
    if extras:
        value["extras"] = extras
    return value, []


def _role_as_v2(index: int, role: Any) -> tuple[dict[str, Any], list[str]]:
    where = f"taskRoles[{index}]"
    if not isinstance(role, dict):
        return {}, [f"{where} (not an object)"]
    cannot = [f"{where}.{key}" for key in role if key not in _V1_ROLE and not _default_completion(key, role[key])]
    # The name becomes a mapping key and the command a list item: a wrong
    # type would be turned into something else, not reported.
    if not isinstance(role.get("name"), str):
        cannot.append(f"{where}.name ({'missing' if role.get('name') is None else 'not a string'})")
    elif role["name"] and not IDENT_RE.fullmatch(role["name"]):
        cannot.append(f"{where}.name {role['name']!r} (a v2 task role name starts with a letter or _, "
                      "then letters, digits and _)")
    command = "" if role.get("command") is None else role["command"]
    if not isinstance(command, str):
        cannot.append(f"{where}.command (not a string)")
    elif "<%" in command:  # v2 reads it as a reference: the command would change, or be refused
        cannot.append(f"{where}.command (it holds <%, where v2 reads a reference)")
    converted: dict[str, Any] = {"instances": role.get("taskNumber", 1), "dockerImage": IMAGE_PREREQUISITE}
    resources = {"cpu": role.get("cpuNumber"), "memoryMB": role.get("memoryMB"), "gpu": role.get("gpuNumber", 0)}
    ports = role.get("portList") or []
    if not isinstance(ports, list) or not all(isinstance(p, dict) for p in ports):
        cannot.append(f"{where}.portList (not a list of objects)")
    elif any(p.get("beginAt", 0) != 0 for p in ports):
        cannot.append(f"{where}.portList (fixed ports: beginAt other than 0)")
    elif any(not IDENT_RE.fullmatch(str(p.get("label"))) for p in ports):
        cannot.append(f"{where}.portList (a v2 port label starts with a letter or _, then letters, digits and _)")
    elif ports:
        resources["ports"] = {str(p.get("label")): p.get("portNumber") for p in ports}
    converted["resourcePerInstance"] = resources
    if role.get("shmMB") is not None:
        converted["extraContainerOptions"] = {"shmMB": role["shmMB"]}
    converted["commands"] = [command]
    return converted, cannot


def _default_completion(key: str, item: Any) -> bool:
    return (key, item) in (("minFailedTaskCount", 1), ("minSucceededTaskCount", None))


# ------------------------------------------------------------ export

# The two protocols give a task role without shmMB different /dev/shm sizes
# (v1 64 MB, v2 512 MB): a config exported to the other protocol has each
# role's size written out, so the job it describes stays the same. The form
# keeps the config as typed; only Export does this.


def v1_export(config: dict[str, Any]) -> dict[str, Any]:
    """`v2_as_form`'s config, each task role's v2 shared memory written out."""
    roles = config.get("taskRoles")
    if not isinstance(roles, list):
        return config
    return {**config, "taskRoles": [_with_v2_shm(role) for role in roles]}


def _with_v2_shm(role: Any) -> Any:
    if not isinstance(role, dict) or role.get("shmMB"):
        return role
    memory = role.get("memoryMB")
    shm = default_shm_mb(memory) if isinstance(memory, int) and not isinstance(memory, bool) else None
    return role if shm is None else {**role, "shmMB": shm}


def v2_export(value: dict[str, Any]) -> dict[str, Any]:
    """`form_as_v2`'s config of a v1 one, each task role's v1 shared memory
    written out (none or 0 in v1 is Docker's default, 64 MB)."""
    roles = value.get("taskRoles")
    if not isinstance(roles, dict):
        return value
    return {**value, "taskRoles": {name: _with_v1_shm(role) for name, role in roles.items()}}


def _with_v1_shm(role: Any) -> Any:
    options = role.get("extraContainerOptions") if isinstance(role, dict) else None
    if not isinstance(role, dict) or (isinstance(options, dict) and options.get("shmMB")):
        return role
    return {**role, "extraContainerOptions": {**(options or {}), "shmMB": V1_DEFAULT_SHM_MB}}


def v2_text(value: dict[str, Any]) -> str:
    """A v2 config as YAML: keys in order, long commands kept readable."""
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=100, default_flow_style=False)


def v1_text(config: dict[str, Any]) -> str:
    return json.dumps(config, ensure_ascii=False, indent=2)


# ------------------------------------------------------------ problem paths

_ROLE_FIELD = {"instances": "taskNumber", "resourcePerInstance.cpu": "cpuNumber", "resourcePerInstance.memoryMB":
               "memoryMB", "resourcePerInstance.gpu": "gpuNumber", "extraContainerOptions.shmMB": "shmMB",
               "dockerImage": "image"}
_TOP_FIELD = {"name": "jobName", "defaults.virtualCluster": "virtualCluster", "extras.gpuType": "gpuType",
              "jobRetryCount": "retryCount"}


def form_path(path: str, value: Any) -> str:
    """The form field a v2 problem's path belongs to (`taskRoles.worker.
    resourcePerInstance.cpu` -> `taskRoles[0].cpuNumber`); other paths,
    and v1 ones (`taskRoles[0].gpuNumber`), as they are."""
    if path in _TOP_FIELD:
        return _TOP_FIELD[path]
    if path.startswith("prerequisites"):
        return "image"
    match = re.match(r"^taskRoles\.([A-Za-z0-9_]+)(?:\.(.*))?$", path)
    roles = value.get("taskRoles") if isinstance(value, dict) else None
    if not match or not isinstance(roles, dict) or match.group(1) not in roles:
        return path
    index, rest = list(roles).index(match.group(1)), match.group(2) or ""
    if rest == "dockerImage":
        return "image"
    if rest in _ROLE_FIELD:
        return f"taskRoles[{index}].{_ROLE_FIELD[rest]}"
    if rest.startswith("commands"):
        return f"taskRoles[{index}].command"
    port = re.match(r"^resourcePerInstance\.ports\.(.+)$", rest)
    role = roles[match.group(1)]
    resources = role.get("resourcePerInstance") if isinstance(role, dict) else None
    ports = resources.get("ports") if isinstance(resources, dict) else None
    if port and isinstance(ports, dict) and port.group(1) in ports:
        return f"taskRoles[{index}].portList[{list(ports).index(port.group(1))}].portNumber"
    return f"taskRoles[{index}]" if not rest else path
