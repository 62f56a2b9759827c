"""A JSON reader that accepts // and /* */ comments and remembers positions.

The reference job configs carry comments, so plain `json.loads` cannot read
them. Stripping comments with a regex breaks on `//` inside strings (every
`hdfs://` URI), so this is a small recursive-descent reader instead. It reuses
the standard library's string and number scanners, so escapes and numbers mean
exactly what they mean in JSON, and it records the line and column of every
value and key so schema errors can point into the text the user typed.
"""

from __future__ import annotations

import bisect
import json.decoder
import math
import re
from dataclasses import dataclass
from typing import Any

from jobs.ids import is_ascii_digits

MAX_DEPTH = 32
# The last step of a path: ".key" or "[3]".
_PARENT_RE = re.compile(r"(\.[^.\[\]]+|\[\d+\])$")
# A JSON number (as json.scanner reads it) or true, false, null.
_SCALAR_RE = re.compile(r"-?(?:0|[1-9]\d*)(?P<frac>\.\d+)?(?P<exp>[eE][-+]?\d+)?|(?P<literal>true|false|null)")
_LITERALS = {"true": True, "false": False, "null": None}
SURROGATE_RE = re.compile("[\ud800-\udfff]")
NUL_PROBLEM = "strings may not contain the NUL character (\\u0000)"
SURROGATE_PROBLEM = "string holds half of a unicode surrogate pair"
# Whitespace, // line comments and closed /* */ comments, in any number.
_SKIP_RE = re.compile(r"(?:[ \t\n\r]+|//[^\n]*|/\*.*?\*/)*", re.DOTALL)
_GAP_STARTS = frozenset(" \t\n\r/")  # what such a gap may start with ("", the end, is not one)


def unstorable(text: str) -> str | None:
    """Why `text` cannot be stored, or None: the databases' text and JSON
    take neither a NUL nor half of a surrogate pair (a JSON or YAML
    "\\ud800" escape decodes to one). Job configs and API bodies alike."""
    if "\x00" in text:
        return NUL_PROBLEM
    if SURROGATE_RE.search(text):
        return SURROGATE_PROBLEM
    return None


@dataclass
class JsoncSyntaxError(Exception):
    message: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.message}"


class _Node:
    """Where a container value starts, and where its members start: object
    members by key (with where each key itself starts), list items by index.
    A member that is not a container is just its offset (an int)."""

    __slots__ = ("start", "children", "keys")

    def __init__(self, start: int, is_object: bool) -> None:
        self.start = start
        self.children: dict[str, _Node | int] | list[_Node | int] = {} if is_object else []
        self.keys: dict[str, int] | None = {} if is_object else None


class Positions:
    """Line and column of each value by path (`taskRoles[0].name`; a key
    itself as `path#key`), as the config checks name them.

    Kept as a tree of offsets, not a table of path strings: a table costs the
    path's length for every value, so long keys over long lists or deep
    nesting grew it faster than the text. The tree costs one small entry per
    value, and line and column are worked out only when asked for."""

    def __init__(self, root: _Node | int | None, line_starts: list[int]) -> None:
        self._root = root
        self._line_starts = line_starts

    def where(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._line_starts, offset) - 1
        return line + 1, offset - self._line_starts[line] + 1

    def _offset(self, path: str) -> int | None:
        is_key = path.endswith("#key")
        rest = path[: -len("#key")] if is_key else path
        entry, parent, last_key = self._root, None, None
        first = True
        while rest:
            if entry is None or isinstance(entry, int):
                return None
            parent = entry
            if rest.startswith("["):
                close = rest.find("]")
                digits = rest[1:close]
                # More digits than any list's length has: int() would refuse
                # past 4,300 (a key spelled "a[999...]" gets here).
                if close < 0 or not isinstance(entry.children, list) or not is_ascii_digits(digits) or len(digits) > 18:
                    return None
                index = int(digits)
                entry = entry.children[index] if index < len(entry.children) else None
                rest, last_key = rest[close + 1 :], None
            else:
                if not first:
                    if not rest.startswith("."):
                        return None
                    rest = rest[1:]
                if not isinstance(entry.children, dict):
                    return None
                key = self._key_at(entry.children, rest)
                if key is None:
                    return None
                entry, rest, last_key = entry.children[key], rest[len(key) :], key
            first = False
        if is_key:
            if parent is None or last_key is None or parent.keys is None:
                return None
            return parent.keys.get(last_key)
        if entry is None:
            return None
        return entry if isinstance(entry, int) else entry.start

    @staticmethod
    def _key_at(children: dict[str, _Node | int], rest: str) -> str | None:
        """The member key `rest` starts with: tried at each "." or "[" (and
        the end), so keys holding those characters are found too."""
        for end, char in enumerate(rest):
            if char in ".[" and rest[:end] in children:
                return rest[:end]
        return rest if rest in children else None

    def nearest(self, path: str) -> tuple[int | None, int | None]:
        """Where `path` starts or, when it is not in the text (a missing
        field), where its nearest enclosing value starts."""
        probe = path.removesuffix("#key")
        while True:
            offset = self._offset(probe)
            if offset is not None:
                return self.where(offset)
            if not probe:
                return None, None
            parent = _PARENT_RE.sub("", probe)
            probe = "" if parent == probe else parent

    def get(self, path: str, default: tuple[int, int] | None = None) -> tuple[int, int] | None:
        offset = self._offset(path)
        return default if offset is None else self.where(offset)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self._offset(path) is not None

    def __getitem__(self, path: str) -> tuple[int, int]:
        found = self.get(path)
        if found is None:
            raise KeyError(path)
        return found


@dataclass
class Document:
    """The decoded value and where each of its parts starts in the text."""

    value: Any
    positions: Positions


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        # Line starts turn an offset into (line, column) in O(log n).
        self.line_starts = [0] + [match.end() for match in re.finditer("\n", text)]

    def where(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return line + 1, offset - self.line_starts[line] + 1

    def fail(self, message: str, offset: int | None = None) -> JsoncSyntaxError:
        line, column = self.where(self.pos if offset is None else offset)
        return JsoncSyntaxError(message, line, column)

    def skip(self) -> None:
        # Most gaps are empty (compact JSON): a look at one character, no regex.
        if self.text[self.pos : self.pos + 1] not in _GAP_STARTS:
            return
        # Otherwise one regex call (C speed) per gap; this runs between every two tokens.
        self.pos = _SKIP_RE.match(self.text, self.pos).end()  # type: ignore[union-attr]
        if self.text.startswith("/*", self.pos):
            raise self.fail("comment opened with /* is never closed")

    def value(self, depth: int) -> tuple[Any, _Node | int]:
        """The next value and its position entry."""
        self.skip()
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of input: a value was expected")
        start = self.pos
        char = self.text[start]
        if char == "{":
            return self.obj(depth + 1)
        if char == "[":
            return self.arr(depth + 1)
        if char == '"':
            return self.string(), start
        return self.number(), start

    def check_depth(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels")

    def check_open(self, opened_at: int, what: str) -> None:
        if self.pos >= len(self.text):
            line, column = self.where(opened_at)
            raise self.fail(f"unexpected end of input: the {what} opened at line {line}, column {column} is never closed")

    def obj(self, depth: int) -> tuple[dict[str, Any], _Node | int]:
        self.check_depth(depth)
        opened_at = self.pos
        self.pos += 1
        result: dict[str, Any] = {}
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return result, opened_at  # nothing inside to point at: its offset will do
        node = _Node(opened_at, is_object=True)
        children, keys = node.children, node.keys
        assert isinstance(children, dict) and keys is not None
        while True:
            self.skip()
            self.check_open(opened_at, "object")
            if not self.text.startswith('"', self.pos):
                raise self.fail('expected a key in double quotes, like "jobName"')
            key_offset = self.pos
            key = self.string()
            if key in result:
                raise self.fail(f'duplicate key "{key}"', key_offset)
            keys[key] = key_offset
            self.skip()
            if not self.text.startswith(":", self.pos):
                raise self.fail(f'expected ":" after the key "{key}"')
            self.pos += 1
            result[key], children[key] = self.value(depth)
            if self.closed_after_member("}", opened_at, "object"):
                return result, node

    def arr(self, depth: int) -> tuple[list[Any], _Node | int]:
        self.check_depth(depth)
        opened_at = self.pos
        self.pos += 1
        result: list[Any] = []
        self.skip()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return result, opened_at
        node = _Node(opened_at, is_object=False)
        children = node.children
        assert isinstance(children, list)
        while True:
            # Numbers and literals straight from one regex: a list of a
            # hundred thousand of them must not cost a call chain each.
            match = _SCALAR_RE.match(self.text, self.pos)
            if match is not None:
                entry = self.pos
                item = self.scalar(match)
            else:
                item, entry = self.value(depth)
            result.append(item)
            children.append(entry)
            if self.closed_after_member("]", opened_at, "list"):
                return result, node

    def closed_after_member(self, close: str, opened_at: int, what: str) -> bool:
        """Past what follows a member: a comma (False: another member comes)
        or the closing bracket (True); anything else is an error."""
        self.skip()
        if self.text.startswith(",", self.pos):
            self.pos += 1
            self.skip()
            if self.text.startswith(close, self.pos):
                raise self.fail(f'trailing comma before "{close}"')
            return False
        if self.text.startswith(close, self.pos):
            self.pos += 1
            return True
        self.check_open(opened_at, what)
        article = "an" if what == "object" else "a"
        raise self.fail(f'expected "," or "{close}" after a value in {article} {what}')

    def string(self) -> str:
        start = self.pos
        try:
            value, end = json.decoder.scanstring(self.text, self.pos + 1, True)
        except json.JSONDecodeError as exc:
            raise self.fail(f"bad string: {exc.msg}", exc.pos) from None
        problem = unstorable(value)
        if problem:
            raise self.fail(problem, start)
        self.pos = end
        return value

    def number(self) -> Any:
        """A number, true, false or null."""
        match = _SCALAR_RE.match(self.text, self.pos)
        if match is None:
            snippet = self.text[self.pos : self.pos + 12].split("\n")[0]
            raise self.fail(f"unexpected text {snippet!r}: expected a value (string, number, object, list, true, false or null)")
        return self.scalar(match)

    def scalar(self, match: re.Match[str]) -> Any:
        """The value of a _SCALAR_RE match at self.pos; moves past it."""
        start = self.pos
        self.pos = match.end()
        literal = match.group("literal")
        if literal:
            return _LITERALS[literal]
        if self.pos - start > 64:
            raise self.fail("number is too long (more than 64 characters)", start)
        if match.group("frac") or match.group("exp"):
            result = float(match.group(0))
            if math.isinf(result):
                raise self.fail("number is too large", start)
            return result
        return int(match.group(0))


def loads(text: str) -> Document:
    """Decode JSON-with-comments text; raise JsoncSyntaxError with a position."""
    reader = _Reader(text)
    value, entry = reader.value(0)
    reader.skip()
    if reader.pos < len(text):
        raise reader.fail("unexpected text after the end of the JSON document")
    return Document(value=value, positions=Positions(entry, reader.line_starts))
