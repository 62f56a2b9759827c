"""The engine registry: an engine URL's scheme picks the implementation."""

from __future__ import annotations

import pytest

from jobs.node import launcher
from jobs.node.launcher.docker import DockerEngine, _room_left


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


def test_it_watches_the_disk_of_no_engine_it_cannot_see():
    # Not asked: an engine over TCP runs elsewhere, its disk is not ours to statvfs.
    assert DockerEngine("tcp://10.0.0.5:2375").data_root() is None
    _room_left("x/y:1", None, 10**12)  # out of sight: no floor


def test_it_gives_a_pull_up_below_the_free_space_floor(tmp_path):
    _room_left("x/y:1", str(tmp_path), 1)
    _room_left("x/y:1", str(tmp_path), None)
    with pytest.raises(launcher.LaunchError, match=r"could not pull image x/y:1: the node's disk for images has "
                                                   r"less than 1000000000000 MB free \(IMAGE_PULL_MIN_FREE_MB\)"):
        _room_left("x/y:1", str(tmp_path), 10**12)
