"""A JSON reader that accepts // and /* */ comments and remembers positions.

The reference job configs carry comments, so plain `json.loads` cannot read
them. Stripping comments with a regex breaks on `//` inside strings (every
`hdfs://` URI), so this is a small recursive-descent reader instead. It reuses
the standard library's string and number scanners, so escapes and numbers mean
exactly what they mean in JSON, and it records the line and column of every
value and key so schema errors can point into the text the user typed.
"""

from __future__ import annotations

import json.decoder
import json.scanner
import math
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 32
_WHITESPACE = " \t\n\r"


@dataclass
class JsoncSyntaxError(Exception):
    message: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.message}"


@dataclass
class Document:
    """The decoded value and, for every path, where its value starts."""

    value: Any
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)


def _path_key(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.positions: dict[str, tuple[int, int]] = {}
        # Line starts let us turn an offset into (line, column) in O(log n).
        self._line_starts = [0]
        for index, char in enumerate(text):
            if char == "\n":
                self._line_starts.append(index + 1)

    def where(self, offset: int) -> tuple[int, int]:
        lo, hi = 0, len(self._line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self._line_starts[lo] + 1

    def fail(self, message: str, offset: int | None = None) -> JsoncSyntaxError:
        line, column = self.where(self.pos if offset is None else offset)
        return JsoncSyntaxError(message, line, column)

    def skip(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            char = text[self.pos]
            if char in _WHITESPACE:
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise self.fail("comment opened with /* is never closed")
                self.pos = end + 2
            else:
                return

    def value(self, path: str, depth: int) -> Any:
        self.skip()
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of input: a value was expected")
        self.positions.setdefault(path, self.where(self.pos))
        char = self.text[self.pos]
        if char == "{":
            return self.obj(path, depth + 1)
        if char == "[":
            return self.arr(path, depth + 1)
        if char == '"':
            return self.string()
        for word, result in (("true", True), ("false", False), ("null", None)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return result
        return self.number()

    def check_depth(self, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels")

    def check_open(self, opened_at: int, what: str) -> None:
        if self.pos >= len(self.text):
            line, column = self.where(opened_at)
            raise self.fail(f"unexpected end of input: the {what} opened at line {line}, column {column} is never closed")

    def obj(self, path: str, depth: int) -> dict[str, Any]:
        self.check_depth(depth)
        opened_at = self.pos
        self.pos += 1
        result: dict[str, Any] = {}
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return result
        while True:
            self.skip()
            self.check_open(opened_at, "object")
            if not self.text.startswith('"', self.pos):
                raise self.fail('expected a key in double quotes, like "jobName"')
            key_offset = self.pos
            key = self.string()
            child = _path_key(path, key)
            if key in result:
                raise self.fail(f'duplicate key "{key}"', key_offset)
            self.positions[child + "#key"] = self.where(key_offset)
            self.skip()
            if not self.text.startswith(":", self.pos):
                raise self.fail(f'expected ":" after the key "{key}"')
            self.pos += 1
            result[key] = self.value(child, depth)
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                self.skip()
                if self.text.startswith("}", self.pos):
                    raise self.fail('trailing comma before "}"')
                continue
            if self.text.startswith("}", self.pos):
                self.pos += 1
                return result
            self.check_open(opened_at, "object")
            raise self.fail('expected "," or "}" after a value in an object')

    def arr(self, path: str, depth: int) -> list[Any]:
        self.check_depth(depth)
        opened_at = self.pos
        self.pos += 1
        result: list[Any] = []
        self.skip()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return result
        while True:
            result.append(self.value(f"{path}[{len(result)}]", depth))
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                self.skip()
                if self.text.startswith("]", self.pos):
                    raise self.fail('trailing comma before "]"')
                continue
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return result
            self.check_open(opened_at, "list")
            raise self.fail('expected "," or "]" after a value in a list')

    def string(self) -> str:
        start = self.pos
        try:
            value, end = json.decoder.scanstring(self.text, self.pos + 1, True)
        except json.JSONDecodeError as exc:
            raise self.fail(f"bad string: {exc.msg}", exc.pos) from None
        if "\x00" in value:
            raise self.fail("strings may not contain the NUL character (\\u0000)", start)
        if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            raise self.fail("string holds half of a unicode surrogate pair", start)
        self.pos = end
        return value

    def number(self) -> int | float:
        match = json.scanner.NUMBER_RE.match(self.text, self.pos)
        if match is None:
            snippet = self.text[self.pos : self.pos + 12].split("\n")[0]
            raise self.fail(f"unexpected text {snippet!r}: expected a value (string, number, object, list, true, false or null)")
        integer, frac, exp = match.groups()
        start = self.pos
        self.pos = match.end()
        if len(match.group(0)) > 64:
            raise self.fail("number is too long (more than 64 characters)", start)
        if frac or exp:
            result = float(match.group(0))
            if math.isinf(result):
                raise self.fail("number is too large", start)
            return result
        return int(integer)


def loads(text: str) -> Document:
    """Decode JSON-with-comments text; raise JsoncSyntaxError with a position."""
    reader = _Reader(text)
    value = reader.value("", 0)
    reader.skip()
    if reader.pos < len(text):
        raise reader.fail("unexpected text after the end of the JSON document")
    return Document(value=value, positions=reader.positions)
