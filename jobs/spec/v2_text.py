"""Protocol v2's `<% $name.path %>` references, and keeping secrets secret.

OpenPAI renders a task role's commands once, at submission, with mustache
and `<%`/`%>` delimiters: `$parameters`, `$secrets` and the role's
`$script`, `$data` and `$output` prerequisites are looked up by dotted path
(`$data.uri[0]` is `$data.uri.0`), and the whole result is trimmed. We do
the same, with two differences (ours): a reference to nothing, or any other
mustache tag, is an error instead of an empty string; and a secret is not
written into the command. It stays a reference, in the one spelling
SECRET_REF makes, until the node agent starts the container
(`resolve_secrets`), so the stored job, its pages and the API never hold it.

Masking: what a job keeps of the text as submitted has every secret value
replaced by MASK (in place, comments and layout kept), and any other place
the text spells a secret of at least MIN_SCRUBBED characters is masked too,
but for mapping keys and secret references: those are names.
Pure: no Django, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import yaml

from jobs.ids import is_ascii_digits
from jobs.spec.yaml_reader import YamlDocument, YamlProblem, load

MASK = "******"
MIN_SCRUBBED = 4
ROOTS = ("parameters", "secrets", "script", "data", "output")

_TAG_RE = re.compile(r"<%(.*?)%>", re.DOTALL)
_PATH_RE = re.compile(r"^\$(?P<root>[A-Za-z]+)(?P<path>(?:\.[^.\s\[\]]+|\[\d+\])*)$")
_STEP_RE = re.compile(r"\.([^.\s\[\]]+)|\[(\d+)\]")
_SECRET_REF_RE = re.compile(r"<% \$secrets((?:\.[A-Za-z0-9_-]+)+) %>")


class RenderProblem(ValueError):
    pass


def secret_ref(path: str) -> str:
    """How a command keeps a reference to a secret until launch."""
    return f"<% $secrets{path} %>"


def _steps(path: str) -> list[str]:
    return [name or index for name, index in _STEP_RE.findall(path)]


def lookup(value: Any, path: str) -> tuple[bool, Any]:
    """(found, value) at a dotted path (`.a.b`, `.uri[0]` or `.uri.0`)."""
    for step in _steps(path):
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and is_ascii_digits(step) and int(step) < len(value):
            value = value[int(step)]
        else:
            return False, None
    return True, value


def as_text(value: Any, *, max_length: int | None = None) -> str:
    """A value as JavaScript's String() writes it, as OpenPAI inserted it;
    _TooLong past `max_length` characters, before they are built (a list of
    aliases of one long string would be a copy of it per alias)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, list):
        parts: list[str] = []
        length = -1
        for item in value:
            parts.append(as_text(item, max_length=max_length))
            length += len(parts[-1]) + 1
            if max_length is not None and length > max_length:
                raise _TooLong
        return ",".join(parts)
    if isinstance(value, dict):
        raise RenderProblem("is a mapping; name one of its fields")
    return str(value)


class _TooLong(Exception):
    """More than render's `max_length`: one problem for the whole line."""


def render(template: str, context: dict[str, Any], *, missing: dict[str, str], max_length: int | None = None) -> str:
    """`template` with every reference replaced; secrets stay references.
    `context` maps each root to its value (None: the role names none);
    `missing` says, per root, what to write when it is None. Past
    `max_length` characters of values put in, it stops with a problem: a
    long parameter referenced many times would otherwise be built whole,
    hundreds of MB from a config within the size limit."""
    problems: list[str] = []
    inserted = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal inserted
        if max_length is None:
            return _replacement(match)
        if inserted > max_length:
            return ""  # said once, below
        try:
            text = _replacement(match)
            inserted += len(text)
        except _TooLong:
            inserted = max_length + 1
        if inserted > max_length:
            problems.append(f"expands to more than {max_length} characters")
            return ""
        return text

    def _replacement(match: re.Match[str]) -> str:
        inside = match.group(1).strip()
        parsed = _PATH_RE.match(inside)
        if parsed is None or parsed.group("root") not in ROOTS:
            problems.append(f"<%{match.group(1)}%> is not a reference this portal knows; write <% $parameters.name %>, "
                            "<% $secrets.name %>, <% $script.uri %>, <% $data.uri[0] %> or <% $output.uri %>")
            return ""
        root, path = parsed.group("root"), parsed.group("path")
        if not path:
            problems.append(f"<% ${root} %> names the whole {root}; name one field, like <% ${root}.name %>")
            return ""
        if context.get(root) is None:
            problems.append(f"<% {inside} %>: {missing[root]}")
            return ""
        found, value = lookup(context[root], path)
        if not found:
            problems.append(f"<% {inside} %>: there is no {root}{path}")
            return ""
        if root == "secrets":
            if isinstance(value, (dict, list)):
                problems.append(f"<% {inside} %> is not a single value")
                return ""
            return secret_ref("".join(f".{step}" for step in _steps(path)))
        try:
            return as_text(value, max_length=max_length)
        except RenderProblem as exc:
            problems.append(f"<% {inside} %> {exc}")
            return ""

    text = _TAG_RE.sub(replace, template)
    if "<%" in _TAG_RE.sub("", template):
        problems.append("a <% is never closed with %>")
    if problems:
        raise RenderProblem("; ".join(problems))
    return text


def resolve_secrets(command: str, secrets: dict[str, Any]) -> str:
    """The command a container runs: each secret reference replaced by its
    value. Only the node agent calls this, right before the launch."""
    def value(match: re.Match[str]) -> str:
        found, secret = lookup(secrets, match.group(1))
        return as_text(secret) if found and not isinstance(secret, (dict, list)) else ""

    return _SECRET_REF_RE.sub(value, command)


# ------------------------------------------------------------------- masking


def secret_leaves(secrets: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, text) of every secret, longest first (so no shorter one splits it)."""
    found: list[tuple[str, str]] = []
    if isinstance(secrets, dict):
        for key, item in secrets.items():
            found.extend(secret_leaves(item, f"{path}.{key}"))
    elif secrets is not None and not isinstance(secrets, list):
        found.append((path, as_text(secrets)))
    return sorted((leaf for leaf in found if leaf[1]), key=lambda leaf: len(leaf[1]), reverse=True)


def secret_values(secrets: Any) -> list[str]:
    return list(dict.fromkeys(text for _, text in secret_leaves(secrets)))


def as_references(command: str, secrets: Any) -> str:
    """A command with every literal spelling of a secret (MIN_SCRUBBED
    characters or more) turned into its reference: the stored job then holds
    no secret even where the user typed one out."""
    references: dict[str, str] = {}
    for path, text in secret_leaves(secrets):
        if len(text) >= MIN_SCRUBBED:
            references.setdefault(text, secret_ref(path))
    if not references:
        return command
    # One pass, longest spelling first, so that no reference just written is
    # rewritten by a shorter secret spelled inside it.
    spelled = re.compile("|".join(map(re.escape, references)))
    return _outside_references(command, lambda part: spelled.sub(lambda found: references[found.group(0)], part))


def scrub(text: str, secrets: Any) -> str:
    """`text` with every spelling of a secret (of MIN_SCRUBBED characters or
    more) masked: for messages and anything else a secret may reach."""
    return scrubber(secrets)(text)


def scrubber(secrets: Any) -> Callable[[str], str]:
    """`scrub` with the secrets read once, for many texts: a config's every
    value and the text between its keys (per text, they cost a sort of
    every secret, and a config within the size limit held 15,000)."""
    values = [secret for secret in secret_values(secrets) if len(secret) >= MIN_SCRUBBED]

    def masked(part: str) -> str:
        for secret in values:
            if secret in part:
                part = part.replace(secret, MASK)
        return part

    return lambda text: _outside_references(text, masked) if values else text


def _outside_references(text: str, change: Callable[[str], str]) -> str:
    """`text` with `change` applied to all but its secret references: inside
    one a secret's spelling is part of a name (`admin` in
    <% $secrets.admin_user %>), and the reference must still name it."""
    pieces: list[str] = []
    end = 0
    for reference in _SECRET_REF_RE.finditer(text):
        pieces += [change(text[end:reference.start()]), reference.group(0)]
        end = reference.end()
    pieces.append(change(text[end:]))
    return "".join(pieces)


def masked_value(value: dict[str, Any]) -> dict[str, Any]:
    """A decoded config with each secret's value replaced by MASK."""
    def mask(item: Any) -> Any:
        return {key: mask(inner) for key, inner in item.items()} if isinstance(item, dict) else MASK

    secrets = value.get("secrets")
    return {**value, "secrets": mask(secrets)} if isinstance(secrets, dict) else dict(value)


def masked_yaml(text: str, document: YamlDocument) -> str:
    """The YAML as submitted, secrets masked where they stand (comments and
    layout kept). When that cannot be done in place, a plain dump."""
    secrets = document.value.get("secrets") if isinstance(document.value, dict) else None
    if not isinstance(secrets, dict) or not secrets:
        return text
    masked = _masked_in_place(text, document, secrets)
    if _is_masked(masked, document.value):
        return masked
    return yaml.safe_dump(_scrub_all(masked_value(document.value), secrets), sort_keys=False, allow_unicode=True)


def masked_json(value: dict[str, Any]) -> str:
    return json.dumps(_scrub_all(masked_value(value), value.get("secrets")), indent=2, ensure_ascii=False) + "\n"


def _masked_in_place(text: str, document: YamlDocument, secrets: dict[str, Any]) -> str:
    """Each secret's value replaced by MASK where it stands, and any other
    spelling of a secret masked (comments too), but for mapping keys: they
    are names (a secret's own, `password` under auth), and a clone of the
    job needs them as they are."""
    edits = sorted([(start, end, True) for start, end in _secret_spans(document)]
                   + [(start, end, False) for start, end in _key_spans(document.root)])
    masked = scrubber(secrets)
    pieces: list[str] = []
    done = 0
    for start, end, is_secret in edits:
        if start < done:
            continue  # none overlap in what the reader takes (keys are scalars); never write text twice
        pieces.append(masked(text[done:start]))
        span = text[start:end]
        pieces.append(f"'{MASK}'" + span[len(span.rstrip("\n")):] if is_secret else span)
        done = end
    pieces.append(masked(text[done:]))
    return "".join(pieces)


def _key_spans(root: yaml.Node) -> set[tuple[int, int]]:
    spans: set[tuple[int, int]] = set()
    seen: set[int] = set()

    def walk(node: yaml.Node) -> None:
        if id(node) in seen:  # an alias is the same node again
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                spans.add((key.start_mark.index, key.end_mark.index))
                walk(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)

    walk(root)
    return spans


def _secret_spans(document: YamlDocument) -> list[tuple[int, int]]:
    root = document.root
    node = next((v for k, v in root.value if getattr(k, "value", None) == "secrets"), None)
    spans: list[tuple[int, int]] = []

    def leaves(item: yaml.Node) -> None:
        if isinstance(item, yaml.MappingNode):
            for _, inner in item.value:
                leaves(inner)
        elif isinstance(item, yaml.SequenceNode):
            for inner in item.value:
                leaves(inner)
        else:
            spans.append((item.start_mark.index, item.end_mark.index))

    if node is not None:
        leaves(node)
    return spans


def _is_masked(masked: str, original: dict[str, Any]) -> bool:
    """The masked text still reads as the same config, secrets masked."""
    try:
        again = load(masked).value
    except YamlProblem:
        return False
    return again == _scrub_all(masked_value(original), original.get("secrets"))


def _scrub_all(value: Any, secrets: Any) -> Any:
    masked = scrubber(secrets)

    def each(item: Any) -> Any:
        if isinstance(item, dict):
            return {key: each(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [each(inner) for inner in item]
        return masked(item) if isinstance(item, str) else item

    return each(value)
