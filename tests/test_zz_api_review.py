"""A hostile user's requests to the REST API (v1 and v2) and configs to its
parsers: each must be refused with an answer naming what is wrong, never a
500, a worker tied up, or something stored that breaks later.

Users: alice (owner), bob (another user), an admin; each test makes its own.
"""

from __future__ import annotations

import tracemalloc

import pytest

from jobs.spec import SpecError, parse_config_text


def _v2_with_parameter(parameter: str, command: str) -> str:
    return f"""protocolVersion: 2
name: expanding
type: job
parameters:
{parameter}
prerequisites:
  - name: img
    type: dockerimage
    uri: busybox
taskRoles:
  main:
    instances: 1
    dockerImage: img
    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}
    commands:
      - "{command}"
"""


@pytest.mark.parametrize("parameter, references", [
    ("  p: " + "x" * 100_000, 1000),  # a long value, referenced many times
    ("  s: &s " + "x" * 100_000 + "\n  p: [" + ", ".join(["*s"] * 500) + "]", 2),  # a list of aliases of one
])
def test_it_refuses_commands_that_expand_past_the_limit_without_building_them(parameter, references):
    text = _v2_with_parameter(parameter, "<% $parameters.p %>" * references)
    assert len(text.encode()) < 256 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as refused:
            parse_config_text(text, user_name="alice", default_fs_uri="file:///")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "taskRoles.main.commands" in str(refused.value)
    assert "65536 characters" in str(refused.value)
    assert peak < 30 * 1024 * 1024, f"{peak // 2**20} MB to refuse a config of {len(text) // 1024} KB"
