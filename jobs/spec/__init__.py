"""The job-config language: OpenPAI's v1 JSON and v2 YAML, parsed into typed objects.

One parser serves the web form, the JSON box, file import and the REST API.
It is pure: no Django, no I/O. Everything OpenPAI's reference documents
(the v1 job reference, the early job config and the Chinese submit guide)
say about a field is enforced here, and every problem is reported at once
with its path (``taskRoles[1].memoryMB``), what was expected, and, when the
text is at hand, its line and column.

    language.py    names, limits, typed objects, variable substitution
    validation.py  the field-by-field checks (v1)
    v2.py          protocol v2's field-by-field checks, into the same JobSpec
    v2_text.py     v2's <% $... %> references and secret masking
    yaml_reader.py safe YAML with positions and limits
    convert.py     between the protocols, for Submit Job's form and Export
    (here)         decoding text and the entry points (`parse_config_text`
                   takes either protocol; `read_config` only decodes)

Choices where the reference is silent are marked "(ours)".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs import jsonc
from jobs.spec.language import (
    MAX_CONFIG_BYTES, MAX_TASKS_PER_JOB, MAX_TASK_NUMBER, MAX_CPU_NUMBER, MAX_MEMORY_MB, MAX_GPU_NUMBER,
    MAX_PORT_NUMBER, MAX_RETRY_COUNT, MAX_NAME_LENGTH, JOB_NAME_RE, ROLE_NAME_RE, LABEL_RE, VC_NAME_RE,
    GPU_TYPE_RE, MAX_GPU_TYPE_LENGTH, ENV_NAME_RE, BOOLEAN_ENVS, JOB_FIELDS, JOB_KEPT_FIELDS, ROLE_FIELDS, ROLE_KEPT_FIELDS, PORT_FIELDS,
    DIR_FIELDS, Scalar, SpecProblem, SpecError, PortSpec, TaskRoleSpec, JobSpec, ParsedConfig, env_value,
    substitute, default_output_dir,
)
from jobs.spec import v2_text, yaml_reader
from jobs.spec.v2 import V2Validator
from jobs.spec.validation import _Validator

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
    validator.finish()
    if validator.problems or spec is None:
        raise SpecError(validator.problems, validator.warnings)
    return ParsedConfig(spec=spec, warnings=validator.warnings, raw=text)


def parse_job_value(value: Any, *, user_name: str, default_fs_uri: str) -> ParsedConfig:
    """Validate an already-decoded config (for example a JSON API body)."""
    try:
        text = json.dumps(value, ensure_ascii=False, indent=2)
    except (TypeError, ValueError) as exc:
        raise SpecError([SpecProblem("", f"not a JSON value: {exc}")]) from None
    return parse_config_text(text, user_name=user_name, default_fs_uri=default_fs_uri)


# Whitespace and comments (JSON's // and /* */, YAML's #) before the config.
_LEADING_RE = re.compile(r"(?:\s+|//[^\n]*|/\*.*?\*/|#[^\n]*)*", re.DOTALL)
_YAML_KEY_RE = re.compile(r"^[\"']?[A-Za-z_][A-Za-z0-9_]*[\"']?[ \t]*:(?:[ \t]|$)", re.MULTILINE)


def protocol_of(text: str) -> int:
    """2 for an OpenPAI v2 config (YAML, or JSON holding protocolVersion and
    no jobName), else 1: the one rule the parser, the API and pages share."""
    rest = text[_LEADING_RE.match(text).end():]  # type: ignore[union-attr]
    if rest.startswith(("{", "[")):
        if '"protocolVersion"' not in rest:
            return 1
        try:
            value = jsonc.loads(text).value
        except jsonc.JsoncSyntaxError:
            return 1
        return 2 if isinstance(value, dict) and "protocolVersion" in value and "jobName" not in value else 1
    return 2 if _YAML_KEY_RE.search(rest) else 1


def parse_config_text(data: str | bytes, *, user_name: str, default_fs_uri: str) -> ParsedConfig:
    """The one entry point: a v1 config (JSON) or a v2 one (YAML, or JSON of
    the same structure), by `protocol_of`. Raises SpecError, never anything
    else; no message quotes a secret."""
    text = decode_text(data)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise _too_big(size)
    if protocol_of(text) == 1:
        return parse_job_config(text, user_name=user_name, default_fs_uri=default_fs_uri)
    return parse_v2_text(text, user_name=user_name, default_fs_uri=default_fs_uri)


@dataclass(frozen=True)
class ConfigDocument:
    """A config's text decoded, before any field is checked: which protocol
    it is in, its value, and where each value stands (`positions.nearest`)."""

    protocol: int
    value: Any
    positions: Any
    yaml: yaml_reader.YamlDocument | None = None


def read_config(text: str) -> ConfigDocument:
    """Decode `text` as `parse_config_text` does (JSON for v1; YAML, or JSON
    of the same structure, for v2), checking no field. Raises SpecError with
    the line and column of a syntax error."""
    protocol = protocol_of(text)
    if protocol == 1 or text[_LEADING_RE.match(text).end():].startswith("{"):  # type: ignore[union-attr]
        try:
            decoded = jsonc.loads(text)
        except jsonc.JsoncSyntaxError as exc:
            raise SpecError([SpecProblem("", f"invalid JSON: {exc.message}", exc.line, exc.column)]) from None
        return ConfigDocument(protocol, decoded.value, decoded.positions)
    try:
        document = yaml_reader.load(text)
    except yaml_reader.YamlProblem as exc:
        raise SpecError([SpecProblem(exc.path, exc.message, exc.line, exc.column)]) from None
    return ConfigDocument(2, document.value, document.positions, document)


def parse_v2_text(text: str, *, user_name: str, default_fs_uri: str) -> ParsedConfig:
    read = read_config(text)
    document, value, positions = read.yaml, read.value, read.positions
    validator = V2Validator(positions, user_name=user_name, default_fs_uri=default_fs_uri)
    if document is not None:
        _refuse_anchored_secrets(document, validator)
    spec, secrets = validator.job(value)
    validator.finish()
    masked = v2_text.scrubber(secrets)
    problems = [_scrubbed(p, masked) for p in validator.problems]
    warnings = [_scrubbed(p, masked) for p in validator.warnings]
    if problems or spec is None:
        raise SpecError(problems, warnings)
    raw = v2_text.masked_yaml(text, document) if document is not None else v2_text.masked_json(value)
    return ParsedConfig(spec=spec, warnings=warnings, raw=raw, secrets=secrets, protocol_version=2)


def _scrubbed(problem: SpecProblem, masked: Callable[[str], str]) -> SpecProblem:
    return SpecProblem(problem.path, masked(problem.message), problem.line, problem.column)


def _refuse_anchored_secrets(document: yaml_reader.YamlDocument, validator: V2Validator) -> None:
    """A secret may be used only as <% $secrets.name %>: an anchor (&x) or an
    alias (*x) would copy it where it is not masked."""
    root = document.root
    node = next((v for k, v in getattr(root, "value", ()) if getattr(k, "value", None) == "secrets"), None) \
        if root.id == "mapping" else None
    stack = [node] if node is not None else []
    while stack:
        item = stack.pop()
        if id(item) in document.anchored:
            validator.error("secrets", "secrets may not use YAML anchors (&name) or aliases (*name); "
                                       "use <% $secrets.name %> where a secret is needed")
            return
        if item.id == "mapping":
            stack.extend(v for _, v in item.value)
        elif item.id == "sequence":
            stack.extend(item.value)


__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_TASKS_PER_JOB",
    "MAX_TASK_NUMBER",
    "MAX_CPU_NUMBER",
    "MAX_MEMORY_MB",
    "MAX_GPU_NUMBER",
    "MAX_PORT_NUMBER",
    "MAX_RETRY_COUNT",
    "MAX_NAME_LENGTH",
    "JOB_NAME_RE",
    "ROLE_NAME_RE",
    "LABEL_RE",
    "VC_NAME_RE",
    "ENV_NAME_RE",
    "BOOLEAN_ENVS",
    "GPU_TYPE_RE",
    "MAX_GPU_TYPE_LENGTH",
    "JOB_FIELDS",
    "JOB_KEPT_FIELDS",
    "ROLE_FIELDS",
    "ROLE_KEPT_FIELDS",
    "PORT_FIELDS",
    "DIR_FIELDS",
    "Scalar",
    "SpecProblem",
    "SpecError",
    "PortSpec",
    "TaskRoleSpec",
    "JobSpec",
    "ParsedConfig",
    "env_value",
    "substitute",
    "default_output_dir",
    "decode_text",
    "parse_job_config",
    "parse_job_value",
    "parse_config_text",
    "protocol_of",
    "ConfigDocument",
    "read_config",
]
