"""Finding 3: the config parser's memory grew superlinearly. The JSON-with-
comments reader kept a path string for every value (a 23 KB config cost
78 MB), so any logged-in user could make a web worker take gigabytes. It now
keeps a tree of offsets, and the checks stop listing after 100 problems.

Held here: parsing any config up to the size limit, in adversarial shapes,
costs at most 50 MB more memory, and memory grows in proportion to the text.
Time is measured by bench/config_parse.py (never a timed test).
"""

from __future__ import annotations

import json
import tracemalloc

from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobs.spec import MAX_CONFIG_BYTES, SpecError, parse_job_config

LIMIT_MB = 50
ROLE = {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "gpuNumber": 0, "command": "true"}


def adversarial(shape: str, key_length: int, size: int) -> str:
    """A config of about `size` bytes of the given shape."""
    key = "k" * key_length
    base = {"jobName": "a", "image": "b", "taskRoles": [ROLE]}
    room = max(0, size - len(json.dumps(base)) - key_length - 64)
    if shape == "long key times long list":
        base["extras"] = {key: [0] * (room // 2)}
    elif shape == "many small objects":
        base["extras"] = {key: [{} for _ in range(room // 3)]}
    elif shape == "deep nesting":
        nested: object = 0
        for _ in range(25):
            nested = {key[:200]: nested}
        base["extras"] = {"x": [nested] * max(1, room // (25 * (min(key_length, 200) + 5)))}
    elif shape == "many unknown keys":
        base.update({f"{key[:40]}{i}": 0 for i in range(room // (min(key_length, 40) + 10))})
    elif shape == "many bad task roles":
        base["taskRoles"] = [{"name": key[:60], "taskNumber": "x"}] * (room // (min(key_length, 60) + 30))
    text = json.dumps(base, separators=(",", ":"))
    return text


def peak_mb(text: str) -> float:
    tracemalloc.start()
    try:
        try:
            parse_job_config(text, user_name="alice", default_fs_uri="file://")
        except SpecError:
            pass
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


SHAPES = st.sampled_from(["long key times long list", "many small objects", "deep nesting", "many unknown keys",
                          "many bad task roles"])


@settings(max_examples=5, deadline=None)
@given(shape=SHAPES, key_length=st.integers(1, 4000))
@example(shape="long key times long list", key_length=4000)
@example(shape="many small objects", key_length=1)
@example(shape="many bad task roles", key_length=60)
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


def test_it_lists_at_most_a_hundred_problems_and_says_more_were_found():
    text = adversarial("many bad task roles", 10, MAX_CONFIG_BYTES - 512)
    try:
        parse_job_config(text, user_name="alice", default_fs_uri="file://")
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
