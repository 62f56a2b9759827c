"""The job-config language: OpenPAI's v1 JSON, parsed into typed objects.

One parser serves the web form, the JSON box, file import and the REST API.
It is pure: no Django, no I/O. Everything OpenPAI's reference documents
(the v1 job reference, the early job config and the Chinese submit guide)
say about a field is enforced here, and every problem is reported at once
with its path (``taskRoles[1].memoryMB``), what was expected, and, when the
text is at hand, its line and column.

    language.py    names, limits, typed objects, variable substitution
    validation.py  the field-by-field checks
    (here)         decoding text and the two entry points

Choices where the reference is silent are marked "(ours)".
"""

from __future__ import annotations

import json
import re
from typing import Any

from jobs import jsonc
from jobs.spec.language import (
    MAX_CONFIG_BYTES, MAX_TASKS_PER_JOB, MAX_TASK_NUMBER, MAX_CPU_NUMBER, MAX_MEMORY_MB, MAX_GPU_NUMBER,
    MAX_PORT_NUMBER, MAX_RETRY_COUNT, MAX_NAME_LENGTH, JOB_NAME_RE, ROLE_NAME_RE, LABEL_RE, VC_NAME_RE,
    ENV_NAME_RE, BOOLEAN_ENVS, JOB_FIELDS, JOB_KEPT_FIELDS, ROLE_FIELDS, ROLE_KEPT_FIELDS, PORT_FIELDS,
    DIR_FIELDS, Scalar, SpecProblem, SpecError, PortSpec, TaskRoleSpec, JobSpec, ParsedConfig, env_value,
    substitute, default_output_dir,
)
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
]
