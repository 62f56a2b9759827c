"""The engine registry: an engine URL's scheme picks the implementation."""

from __future__ import annotations

import pytest

from jobs.node import launcher
from jobs.node.launcher.docker import DockerEngine


def test_it_makes_a_docker_engine_for_docker_urls():
    for url in ("unix:///var/run/docker.sock", "tcp://10.0.0.5:2375", "ssh://me@gpu-01"):
        engine = launcher.engine_for(url)
        assert isinstance(engine, DockerEngine) and engine.base_url == url


def test_it_finds_a_registered_backend_by_its_scheme():
    made: list[str] = []

    def fake(url: str) -> launcher.Engine:
        made.append(url)
        return object()  # type: ignore[return-value]

    launcher.register_engine("fake-test", fake)
    launcher.engine_for("fake-test://cluster-1")
    assert made == ["fake-test://cluster-1"]


@pytest.mark.parametrize("url", ["k8s://cluster", "/var/run/docker.sock", ""])
def test_it_refuses_urls_no_backend_serves(url):
    with pytest.raises(ValueError, match="known schemes are .*unix://"):
        launcher.engine_for(url)
