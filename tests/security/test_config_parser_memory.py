"""Finding 3: the config parser's memory grew superlinearly. The JSON-with-
comments reader kept a path string for every value (a 23 KB config cost
78 MB), so any logged-in user could make a web worker take gigabytes. It now
keeps a tree of offsets, and the checks stop listing after 100 problems.

Held here: parsing any config up to the size limit, in adversarial shapes
(comments between every token and comments as long as the config included:
the reader takes JSON with comments; nesting down to MAX_DEPTH, the deepest
it takes), costs at most 50 MB more memory, and memory grows in proportion
to the text; one level deeper is refused naming the line and column.
Time is measured by bench/config_parse.py (never a timed test).
"""

from __future__ import annotations

import json
import re
import tracemalloc

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobs import jsonc
from jobs.jsonc import MAX_DEPTH
from jobs.spec import MAX_CONFIG_BYTES, SpecError, parse_config_text

LIMIT_MB = 50
ROLE = {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0, "command": "true"}


def _commented(text: str, body: str) -> str:
    """`text` (compact JSON whose strings hold no brackets, commas or
    colons) with a block comment before and a line comment after every
    bracket, comma and colon: comments between every two tokens."""
    return re.sub(r"([{}\[\],:])", lambda m: f"/*{body}*/{m.group(1)}//{body}\n", text)


def _nested(levels: int, key: str, leaf: object = 0) -> object:
    """`levels` objects one inside the other: {key: {key: ... leaf}}."""
    for _ in range(levels):
        leaf = {key: leaf}
    return leaf


def depth_of(value: object) -> int:
    """How many objects and lists deep `value` goes (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


def adversarial(shape: str, key_length: int, size: int) -> str:
    """A config of about `size` bytes (never more) of the given shape."""
    key = "k" * key_length
    base = {"jobName": "a", "image": "b", "taskRoles": [ROLE]}
    room = max(0, size - len(json.dumps(base)) - key_length - 64)
    if shape == "long key times long list":
        base["extras"] = {key: [0] * (room // 2)}
    elif shape == "many small objects":
        base["extras"] = {key: [{} for _ in range(room // 3)]}
    elif shape == "deep nesting":
        # The config, "extras" and its list are three levels: the rest nest
        # down to the deepest the reader takes (MAX_DEPTH), over and over.
        short = key[:200]
        levels = MAX_DEPTH - 3
        item = levels * (len(short) + 5) + 2  # {"key": per level, its }, the leaf and a comma
        base["extras"] = {"x": [_nested(levels, short)] * max(1, room // item)}
    elif shape == "deepest nesting of lists":
        # The most containers a byte can buy, each MAX_DEPTH deep: [[[...[0]...]]].
        nest = "[" * (MAX_DEPTH - 3) + "0" + "]" * (MAX_DEPTH - 3)
        head = json.dumps(base, separators=(",", ":"))[:-1] + ',"extras":{"x":['
        return head + ",".join([nest] * ((size - len(head) - 3) // (len(nest) + 1))) + "]}}"
    elif shape == "many unknown keys":
        base.update({f"{key[:40]}{i}": 0 for i in range(room // (min(key_length, 40) + 10))})
    elif shape == "many bad task roles":
        base["taskRoles"] = [{"name": key[:60], "taskNumber": "x"}] * (room // (min(key_length, 60) + 30))
    elif shape in ("comments between every token", "long comments"):
        # Short comments around every token (the most comments), or comments
        # key_length long between the items of a list (up to one comment the
        # size of the config).
        every = shape == "comments between every token"
        body = "c" * (min(key_length, 8) if every else key_length)
        head = json.dumps(base, separators=(",", ":"))[:-1] + ',"extras":{"x":['
        head = _commented(head, body) if every else head
        item, tail = _commented("0,", body), _commented("0]}}", body)
        count = max(0, (size - len(head) - len(tail)) // len(item))
        if count == 0:  # a comment too long for even one item: one comment filling the config
            return head + f"/*{'c' * max(0, size - len(head) - 9)}*/0]}}}}"
        return head + item * count + tail
    return json.dumps(base, separators=(",", ":"))


def peak_mb(text: str) -> float:
    tracemalloc.start()
    try:
        try:
            parse_config_text(text, user_name="alice", default_fs_uri="file://")
        except SpecError:
            pass
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


SHAPE_NAMES = ["long key times long list", "many small objects", "deep nesting", "deepest nesting of lists",
               "many unknown keys", "many bad task roles", "comments between every token", "long comments"]
SHAPES = st.sampled_from(SHAPE_NAMES)


@settings(max_examples=5, deadline=None)
@given(shape=SHAPES, key_length=st.integers(1, 4000))
@example(shape="long key times long list", key_length=4000)
@example(shape="many small objects", key_length=1)
@example(shape="many bad task roles", key_length=60)
@example(shape="deep nesting", key_length=200)
@example(shape="deepest nesting of lists", key_length=1)
@example(shape="comments between every token", key_length=1)
@example(shape="long comments", key_length=4000)
@example(shape="long comments", key_length=300_000)  # one comment as long as the config
def test_it_parses_any_config_up_to_the_limit_within_50_mb(shape, key_length):
    text = adversarial(shape, key_length, MAX_CONFIG_BYTES - 512)
    assert len(text.encode()) <= MAX_CONFIG_BYTES
    assert peak_mb(text) <= LIMIT_MB


@settings(max_examples=3, deadline=None)
@given(shape=SHAPES, key_length=st.integers(1, 2000))
def test_it_grows_memory_in_proportion_to_the_text(shape, key_length):
    half = peak_mb(adversarial(shape, key_length, MAX_CONFIG_BYTES // 2))
    full = peak_mb(adversarial(shape, key_length, MAX_CONFIG_BYTES - 512))
    assert full <= 2.5 * half + 1.0, (half, full)


@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_each_shape_is_what_it_says_and_reads_as_json_with_comments(shape):
    text = adversarial(shape, 4000 if shape == "long comments" else 100, MAX_CONFIG_BYTES - 512)
    assert MAX_CONFIG_BYTES - 8 * 1024 <= len(text.encode()) <= MAX_CONFIG_BYTES
    value = jsonc.loads(text).value
    assert value["jobName"] == "a"
    if "nesting" in shape:
        assert depth_of(value) == MAX_DEPTH  # the deepest the reader takes, not less
    if "comments" in shape:
        assert text.count("/*") >= 20 and text.count("//") >= 20
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)  # plain JSON it is not: the comments are there


def _deep_config(levels: int) -> str:
    """A valid config nested `levels` deep (the config and "extras" are two
    levels, lists the rest), one bracket per line, with comments on the way."""
    head = json.dumps({"jobName": "a", "image": "b", "taskRoles": [ROLE]}, indent=1)[:-2]
    opened = "".join(f"\n{' ' * i}[ // level {i + 3}" for i in range(levels - 2))
    closed = "".join(f"\n{' ' * i}]" for i in reversed(range(levels - 2)))
    return f'{head},\n "extras": {{ /* down we go */ "deep":{opened}\n0{closed}\n}}\n}}\n'


def test_it_takes_configs_nested_to_the_limit_and_refuses_one_deeper_saying_where():
    deepest = parse_config_text(_deep_config(MAX_DEPTH), user_name="alice", default_fs_uri="file://")
    assert depth_of(jsonc.loads(deepest.raw).value) == MAX_DEPTH

    text = _deep_config(MAX_DEPTH + 1)
    with pytest.raises(SpecError) as refused:
        parse_config_text(text, user_name="alice", default_fs_uri="file://")
    [problem] = refused.value.problems
    # Where the bracket one level too deep opens, as the Submit page shows it.
    offset = text.index(f"[ // level {MAX_DEPTH + 1}")
    line, column = text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)
    assert (problem.line, problem.column) == (line, column)
    assert str(problem) == (f"config: invalid JSON: nested deeper than {MAX_DEPTH} levels "
                            f"(line {line}, column {column})")


def test_it_lists_at_most_a_hundred_problems_and_says_more_were_found():
    text = adversarial("many bad task roles", 10, MAX_CONFIG_BYTES - 512)
    try:
        parse_config_text(text, user_name="alice", default_fs_uri="file://")
    except SpecError as exc:
        assert len(exc.problems) == 101
        assert "more problems not listed" in exc.problems[-1].message
    else:
        raise AssertionError("the bad task roles were accepted")


def test_it_throttles_the_live_check_per_user_and_refuses_strangers(alice, bob, settings):
    from django.test import Client

    settings.LIVE_CHECKS_PER_MINUTE = 3
    config = json.dumps({"jobName": "a", "image": "b", "taskRoles": [ROLE]})
    mine, theirs = Client(), Client()
    mine.force_login(alice)
    theirs.force_login(bob)
    answers = [mine.post("/submit/validate/", {"config": config}).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    refused = mine.post("/submit/validate/", {"config": config})
    assert 1 <= int(refused["Retry-After"]) <= 61 and refused.json()["throttled"]
    assert theirs.post("/submit/validate/", {"config": config}).status_code == 200  # per user, not global
    anonymous = Client().post("/submit/validate/", {"config": config})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
