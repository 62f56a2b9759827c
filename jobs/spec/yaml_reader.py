"""A safe YAML reader for job configs that remembers where each value is.

Built from PyYAML's own scanner, parser and composer (no constructor: no
tags run code, no Python objects). Scalars are resolved as YAML 1.2's core
schema does, as OpenPAI's js-yaml did: `true`/`false` are booleans but `yes`
and `on` stay strings, and `2020-01-01` stays a string, not a date. Explicit
tags other than the plain ones (`!!str`, `!!int` ...) are refused.

A hostile text cannot hang a worker: the text is at most MAX_CONFIG_BYTES,
nesting at most MAX_DEPTH deep, and the values it stands for, counting every
alias as a full copy of what it names, at most MAX_EXPANDED_NODES holding at
most MAX_EXPANDED_TEXT characters (an alias bomb, "a billion laughs", is
refused before it is expanded). Recursive aliases are refused too. Pure: no
Django, no I/O.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from jobs import jsonc

MAX_DEPTH = 32
MAX_EXPANDED_NODES = 20_000
MAX_ALIASES = 1_000
MAX_EXPANDED_TEXT = 1024 * 1024  # characters, four times the largest config: aliases may repeat, not multiply

_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {_TAG + kind for kind in ("str", "int", "float", "bool", "null", "map", "seq", "merge")}


class YamlProblem(Exception):
    """The text is not YAML we read; `line` and `column` are 1-based, `path`
    the field whose value it is (for a value that cannot be read)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.path = ""


class _CoreResolver(BaseResolver):
    """YAML 1.2 core schema (what js-yaml reads), plus `<<` merge keys."""


_CoreResolver.add_implicit_resolver(_TAG + "null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
_CoreResolver.add_implicit_resolver(_TAG + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_CoreResolver.add_implicit_resolver(
    _TAG + "int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_CoreResolver.add_implicit_resolver(
    _TAG + "float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))
_CoreResolver.add_implicit_resolver(_TAG + "merge", re.compile(r"^<<$"), ["<"])


class _Loader(Reader, Scanner, Parser, Composer, _CoreResolver):
    """PyYAML's composer with a depth limit and a record of anchored nodes."""

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _CoreResolver.__init__(self)
        self.depth = 0
        self.aliases = 0
        self.anchored: set[int] = set()

    def compose_node(self, parent: Node | None, index: Any) -> Node:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise YamlProblem(f"more than {MAX_ALIASES} aliases (*name); write the values out", *_mark(self.peek_event().start_mark))
            return super().compose_node(parent, index)
        anchor = self.peek_event().anchor
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep", *_mark(self.peek_event().start_mark))
        node = super().compose_node(parent, index)
        self.depth -= 1
        if anchor is not None:
            self.anchored.add(id(node))
        return node


def _mark(mark: Any) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


class Positions:
    """Line and column by path (`taskRoles.worker.commands[0]`; a key itself
    as `path#key`), with the same questions as jobs.jsonc.Positions."""

    def __init__(self, text: str) -> None:
        self._starts: dict[str, int] = {}
        self._line_starts = [0] + [match.end() for match in re.finditer("\n", text)]

    def add(self, path: str, offset: int) -> None:
        self._starts.setdefault(path, offset)

    def where(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._line_starts, offset) - 1
        return line + 1, offset - self._line_starts[line] + 1

    def get(self, path: str, default: tuple[int, int] | None = None) -> tuple[int, int] | None:
        offset = self._starts.get(path)
        return default if offset is None else self.where(offset)

    def nearest(self, path: str) -> tuple[int | None, int | None]:
        probe = path.removesuffix("#key")
        while True:
            if probe in self._starts:
                return self.where(self._starts[probe])
            if not probe:
                return None, None
            parent = re.sub(r"(\.[^.\[\]]+|\[\d+\])$", "", probe)
            probe = "" if parent == probe else parent


@dataclass
class YamlDocument:
    value: Any
    positions: Positions
    root: Node
    # Nodes that carry an anchor (&name), by id: secrets may not have any.
    anchored: set[int]


def load(text: str) -> YamlDocument:
    """One YAML document as plain values (dict, list, str, int, float, bool,
    None) and where each is. Raises YamlProblem."""
    positions = Positions(text)
    try:
        # PyYAML's Reader checks every character of the text as it is made:
        # a control character (\x01, \x1b, a raw NUL ...) fails here.
        loader = _Loader(text)
    except ReaderError as exc:
        raise YamlProblem(_unacceptable(exc.character), *positions.where(exc.position)) from None
    try:
        root = loader.get_single_node()
    except YamlProblem:
        raise
    except yaml.MarkedYAMLError as exc:
        # Only the problem and its place: PyYAML's own message quotes the
        # text around it, which may be a secret.
        mark = exc.problem_mark or exc.context_mark
        words = exc.problem or exc.context or "not valid YAML"
        raise YamlProblem(f"invalid YAML: {words}", *(_mark(mark) if mark else (None, None))) from None
    except yaml.YAMLError as exc:
        raise YamlProblem(f"invalid YAML: {type(exc).__name__}") from None
    finally:
        loader.dispose()
    if root is None:
        raise YamlProblem("the config is empty")
    _check_size(root)
    value = _Builder(positions).value(root, "")
    return YamlDocument(value=value, positions=positions, root=root, anchored=loader.anchored)


def _unacceptable(character: int | str) -> str:
    """PyYAML's words for a character YAML does not allow, without the text
    around it (it may be a secret)."""
    code = character if isinstance(character, int) else ord(character)
    if code == 0:
        return "invalid YAML: the config may not contain the NUL character (\\u0000)"
    return f"invalid YAML: unacceptable character #x{code:04x}: special characters are not allowed"


def _check_size(root: Node) -> None:
    """Refuse a document whose expansion (aliases as copies) is too big, in
    values or in text, or that contains itself, before anything walks it."""
    sizes: dict[int, tuple[int, int]] = {}
    visiting: set[int] = set()

    def size(node: Node) -> tuple[int, int]:
        """(values, characters of text) that `node` stands for."""
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in visiting:
            raise YamlProblem("a recursive alias (a value that contains itself)", *_mark(node.start_mark))
        visiting.add(key)
        if isinstance(node, ScalarNode):
            values, text = 1, len(node.value)
        else:
            items = node.value if isinstance(node, SequenceNode) else [part for pair in node.value for part in pair]
            inner = [size(item) for item in items]
            values, text = 1 + sum(n for n, _ in inner), sum(t for _, t in inner)
        visiting.discard(key)
        if values > MAX_EXPANDED_NODES:
            raise YamlProblem(f"the config stands for more than {MAX_EXPANDED_NODES} values once its aliases (*name) "
                              "are expanded", *_mark(node.start_mark))
        if text > MAX_EXPANDED_TEXT:
            # Kept values (extras) are stored expanded with the job: 1,000
            # aliases of a 200 KB string would be a 200 MB row.
            raise YamlProblem(f"the config stands for more than {MAX_EXPANDED_TEXT // 1024} KB of text once its "
                              "aliases (*name) are expanded", *_mark(node.start_mark))
        sizes[key] = (values, text)
        return values, text

    size(root)


class _Builder:
    def __init__(self, positions: Positions) -> None:
        self.positions = positions

    def value(self, node: Node, path: str) -> Any:
        self.positions.add(path, node.start_mark.index)
        if node.tag not in _PLAIN_TAGS:
            raise YamlProblem(f"the tag {node.tag} is not allowed here; write plain values", *_mark(node.start_mark))
        if isinstance(node, ScalarNode):
            try:
                return _scalar(node, _text(node))
            except YamlProblem as exc:
                exc.path = path
                raise
        if isinstance(node, SequenceNode):
            return [self.value(item, f"{path}[{index}]") for index, item in enumerate(node.value)]
        return self.mapping(node, path)

    def mapping(self, node: MappingNode, path: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge":
                merged.update(self._merge(value_node, path))
                continue
            if not isinstance(key_node, ScalarNode):
                raise YamlProblem("a key must be plain text, not a list or mapping", *_mark(key_node.start_mark))
            key = _text(key_node)
            if key in result:
                raise YamlProblem(f'duplicate key "{key}"', *_mark(key_node.start_mark))
            child = f"{path}.{key}" if path else key
            self.positions.add(child + "#key", key_node.start_mark.index)
            result[key] = self.value(value_node, child)
        return {**merged, **result}

    def _merge(self, node: Node, path: str) -> dict[str, Any]:
        sources = node.value if isinstance(node, SequenceNode) else [node]
        merged: dict[str, Any] = {}
        for source in reversed(sources):
            if not isinstance(source, MappingNode):
                raise YamlProblem("<< merges mappings only", *_mark(source.start_mark))
            merged.update(self.mapping(source, path))
        return merged


def _text(node: ScalarNode) -> str:
    """A scalar's text, refusing what a double-quoted escape can make but the
    database cannot store (its JSON and text take neither), in the words of
    jobs/jsonc.py, which refuses the same in v1 configs. PyYAML leaves
    "\\ud83d\\ude00" as two halves; as JSON does, a whole pair is one character."""
    text = node.value
    if jsonc.SURROGATE_RE.search(text):  # "\0" and "\ud800" in double quotes: a raw one never gets past the Reader
        try:
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        except UnicodeDecodeError:
            pass  # a half with no other: unstorable() names it
    problem = jsonc.unstorable(text)
    if problem:
        raise YamlProblem(problem, *_mark(node.start_mark))
    return text


def _scalar(node: ScalarNode, text: str) -> Any:
    tag = node.tag
    if tag == _TAG + "null":
        return None
    if tag == _TAG + "bool":
        return text.lower() == "true"
    if tag == _TAG + "int":
        try:
            if text.startswith(("0x", "0o")):
                return int(text[2:], 16 if text[1] == "x" else 8)
            return int(text)
        except ValueError:
            raise YamlProblem(f"{text!r} is not a whole number", *_mark(node.start_mark)) from None
    if tag == _TAG + "float":
        # A job is kept as JSON, which has no infinity or NaN (v1's reader
        # refuses them too): refused here, with the line, not by the database.
        if text.lower().lstrip("+-") in (".inf", ".nan"):
            raise YamlProblem(f"{text!r} is not a finite number: a config holds no infinity or NaN",
                              *_mark(node.start_mark))
        try:
            number = float(text)
        except ValueError:
            raise YamlProblem(f"{text!r} is not a number", *_mark(node.start_mark)) from None
        if not math.isfinite(number):
            raise YamlProblem(f"{text!r} is too large a number", *_mark(node.start_mark))
        return number
    return text
