from pathlib import Path

import pytest

from jobs.spec import parse_job_config

EXAMPLES = sorted((Path(__file__).parent / "data" / "examples").iterdir())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_it_parses_every_reference_example(path: Path) -> None:
    parsed = parse_job_config(path.read_bytes(), user_name="alice", default_fs_uri="hdfs://nn:9000")
    assert parsed.spec.job_name
    assert parsed.spec.task_roles
