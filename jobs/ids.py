"""Ids and small whole numbers typed by users: in URLs, forms and queries.

Two traps made these 500s: `str.isdigit()` is true for "²" and other
digits that `int()` refuses, and a 30-digit id overflows the databases'
64-bit integers when it reaches a query.
"""

from __future__ import annotations

MAX_ID = 2**63 - 1  # the largest value of a BigAutoField on SQLite and PostgreSQL


def is_ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def parse_id(text: str) -> int | None:
    """`text` as a non-negative id a database column can hold, else None."""
    if not is_ascii_digits(text) or len(text) > len(str(MAX_ID)):
        return None
    value = int(text)
    return value if value <= MAX_ID else None
