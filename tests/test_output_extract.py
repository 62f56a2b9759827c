"""What a task leaves in /pai/output reaches the node as a tar archive the
task could forge: only folders and regular files come out of it, nothing
outside the destination, no set-id or world-writable files, and no more
than the task's budget. Checked without extraction filters, which Debian
12's own Python (3.11.2) does not have."""

from __future__ import annotations

import io
import stat
import tarfile
from pathlib import Path

import pytest

from jobs.node.staging import _Budget, _extract_within


def _archive(*members: tuple[str, bytes | None, int, bytes]) -> list[bytes]:
    """(name, content or None for a folder, mode, type) -> the archive's bytes
    in small chunks, as the engine streams them."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content, mode, kind in members:
            info = tarfile.TarInfo(name)
            info.mode, info.type = mode, kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            if content is None or kind != tarfile.REGTYPE:
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    data = buffer.getvalue()
    return [data[i:i + 700] for i in range(0, len(data), 700)]


def _budget(max_bytes: int = 1 << 20, max_files: int = 100) -> _Budget:
    return _Budget(max_bytes, max_files, "the byte limit", "the file limit")


def test_folders_and_files_come_out_with_safe_permissions(tmp_path: Path) -> None:
    stream = _archive(
        ("output", None, 0o755, tarfile.DIRTYPE),
        ("output/model.txt", b"weights\n", 0o6777, tarfile.REGTYPE),
        ("output/run.sh", b"#!/bin/sh\n", 0o755, tarfile.REGTYPE),
        ("output/deep/er/notes.txt", b"x" * 5000, 0o400, tarfile.REGTYPE),  # its folders not listed first
        ("output/passwd", None, 0o777, tarfile.SYMTYPE),
        ("output/hard", None, 0o644, tarfile.LNKTYPE),
        ("output/fifo", None, 0o644, tarfile.FIFOTYPE),
    )
    budget = _budget()
    _extract_within(stream, tmp_path, budget)

    out = tmp_path / "output"
    assert (out / "model.txt").read_bytes() == b"weights\n"
    assert (out / "deep/er/notes.txt").read_bytes() == b"x" * 5000
    assert stat.S_IMODE((out / "model.txt").stat().st_mode) == 0o755  # no set-id bits, nobody else writes
    assert stat.S_IMODE((out / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "deep/er/notes.txt").stat().st_mode) == 0o600  # the owner can still read it
    # Links and special files are never made.
    assert sorted(p.name for p in out.iterdir()) == ["deep", "model.txt", "run.sh"]
    assert (budget.kept_files, budget.kept_bytes, budget.stopped) == (3, 8 + 10 + 5000, "")


@pytest.mark.parametrize("name", ["output/../../escaped.txt", "/tmp/escaped.txt", "../escaped.txt"])
def test_a_name_outside_the_destination_stops_the_extraction(tmp_path: Path, name: str) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = _archive(("output/first.txt", b"kept\n", 0o644, tarfile.REGTYPE),
                      (name, b"evil\n", 0o644, tarfile.REGTYPE))
    with pytest.raises(tarfile.TarError, match="outside /pai/output"):
        _extract_within(stream, dest, _budget())
    assert [p.name for p in tmp_path.rglob("escaped.txt")] == []
    assert not Path("/tmp/escaped.txt").exists()


def test_a_folder_named_outside_the_destination_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = _archive(("output/../../made", None, 0o755, tarfile.DIRTYPE))
    with pytest.raises(tarfile.TarError):
        _extract_within(stream, dest, _budget())
    assert not (tmp_path / "made").exists() and not (tmp_path.parent / "made").exists()


def test_extraction_stops_at_the_first_file_past_the_budget(tmp_path: Path) -> None:
    stream = _archive(("output/a", b"1" * 600, 0o644, tarfile.REGTYPE),
                      ("output/b", b"2" * 600, 0o644, tarfile.REGTYPE),
                      ("output/c", b"3", 0o644, tarfile.REGTYPE))
    budget = _budget(max_bytes=1000)
    _extract_within(stream, tmp_path, budget)
    assert sorted(p.name for p in (tmp_path / "output").iterdir()) == ["a"]
    assert budget.stopped == "/pai/output/b (600 bytes) would pass the byte limit"

    files = _budget(max_files=2)
    _extract_within(_archive(*[(f"output/f{i}", b"x", 0o644, tarfile.REGTYPE) for i in range(4)]), tmp_path / "n", files)
    assert sorted(p.name for p in (tmp_path / "n/output").iterdir()) == ["f0", "f1"]
    assert files.stopped == "/pai/output/f2 would pass the file limit"


def test_a_tree_deeper_than_storage_takes_stops_the_extraction(tmp_path: Path) -> None:
    # A task may leave a thousand nested folders; nothing that deep could be
    # uploaded, and Python's own walks of such a tree (rmtree, rglob) recurse
    # per level. The extraction stops at the first member past the limit.
    from jobs.storage.paths import MAX_DEPTH

    names = ["output/" + "/".join(["d"] * depth) for depth in range(1, MAX_DEPTH + 30)]
    stream = _archive(*((name, None, 0o755, tarfile.DIRTYPE) for name in names),
                      (names[-1] + "/f.txt", b"x", 0o644, tarfile.REGTYPE))
    with pytest.raises(tarfile.TarError, match=f"more than {MAX_DEPTH} folders deep"):
        _extract_within(stream, tmp_path, _budget())
    deepest = max(len(p.relative_to(tmp_path).parts) for p in tmp_path.rglob("*"))
    assert deepest == MAX_DEPTH
