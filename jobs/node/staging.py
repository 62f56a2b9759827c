"""Files between storage and a node: a job's codeDir fetched into a stage
folder on the node (mounted read-only at /pai/code), and what a task left in
/pai/output copied to the job's outputDir when its container ends.

Stage folders live under stage_root(node): one per job attempt,
`job-<job id>-<attempt number>`; the agent removes those of attempts that
are over when it reconciles.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from jobs import storage
from jobs.models import ExitType, Job
from jobs.node.launcher import Engine, LaunchError
from jobs.spec import JobSpec

MB = 1024 * 1024


def stage_root(node_name: str) -> Path:
    return settings.STAGE_DIR / settings.PAI_INSTANCE / node_name


def stage_folder(node_name: str, job_id: int, attempt_number: int) -> Path:
    return stage_root(node_name) / f"job-{job_id}-{attempt_number}"


def owner_reader(job: Job) -> storage.Reader:
    """Who the node acts for when it reads codeDir and authFile or writes
    outputs: the job's owner (on HDFS its requests run as them)."""
    return storage.reader_for(user_name=job.owner.username, is_admin=job.owner.is_admin)


class CodeStager:
    """Fetches codeDir once per job attempt and node; later tasks reuse it."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def stage(self, folder: Path, code_dir: str, *, reader: storage.Reader | None = None) -> tuple[str, int | None]:
        """The host folder holding `code_dir`, and its size in bytes if it
        was fetched now (None: an earlier task fetched it). Raises LaunchError."""
        with self._guard:
            lock = self._locks.setdefault(str(folder), threading.Lock())
        with lock:
            code = folder / "code"
            if (folder / ".complete").exists():
                return str(code), None
            # Fetched into a side folder and renamed, so a crash mid-fetch
            # never leaves a half copy that looks complete.
            partial = folder / "code.partial"
            shutil.rmtree(partial, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            try:
                size = storage.stage_tree(code_dir, partial, max_bytes=settings.CODE_DIR_MAX_MB * MB, reader=reader)
            except storage.StorageError as exc:
                shutil.rmtree(partial, ignore_errors=True)
                raise LaunchError(ExitType.PLATFORM, f"could not fetch codeDir {code_dir}: {exc}") from None
            _readable_in_containers(partial)
            shutil.rmtree(code, ignore_errors=True)
            partial.rename(code)
            (folder / ".complete").touch()
            return str(code), size


def _readable_in_containers(folder: Path) -> None:
    """The staged copy is mounted read-only at /pai/code, and the image may
    run as a user other than the portal's: folders 0755, files 0644, whatever
    the umask made. (Other users of the host cannot reach it: var/ is 0700.)"""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def output_target(spec: JobSpec, role: str, index: int) -> str:
    """Where a task's /pai/output goes: outputDir itself for a one-task job,
    a folder per task (`<role>-<index>`) under it otherwise."""
    if spec.total_tasks == 1:
        return spec.output_dir
    return f"{spec.output_dir.rstrip('/')}/{role}-{index}"


@dataclass
class _Budget:
    """What one task's /pai/output may put in storage: the per-task limits,
    or less when the owner's quota has less room left."""

    max_bytes: int
    max_files: int
    bytes_why: str
    files_why: str
    kept_bytes: int = 0
    kept_files: int = 0
    stopped: str = ""  # why the rest was left out


def _output_budget(target: str) -> _Budget:
    budget = _Budget(settings.OUTPUT_MAX_MB_PER_TASK * MB, settings.OUTPUT_MAX_FILES_PER_TASK,
                     f"the limit of {settings.OUTPUT_MAX_MB_PER_TASK} MB per task (OUTPUT_MAX_MB_PER_TASK)",
                     f"the limit of {settings.OUTPUT_MAX_FILES_PER_TASK} files per task (OUTPUT_MAX_FILES_PER_TASK)")
    room = storage.room_at(target)
    if room is not None and room[0] < budget.max_bytes:
        budget.max_bytes, budget.bytes_why = room[0], f"the {room[0]} bytes left in the job owner's storage quota"
    if room is not None and room[1] < budget.max_files:
        budget.max_files, budget.files_why = room[1], f"the {room[1]} files left in the job owner's storage quota"
    return budget


def upload_output(engine: Engine, container_id: str, target: str, *, reader: storage.Reader | None = None) -> str | None:
    """Copy what the stopped task left in /pai/output to `target`, as far as
    the limits allow: whole files in the archive's order until the first one
    that would pass a limit; it and the files after it are left out (never
    half a file). Returns what happened, for the task's platform log; None
    if there was nothing."""
    stream = engine.archive(container_id, "/pai/output")
    if stream is None:
        return None
    with tempfile.TemporaryDirectory(dir=settings.VAR_DIR / "tmp") as tmp:
        try:
            budget = _output_budget(target)
            _extract_within(stream, Path(tmp), budget)
            folder = Path(tmp) / "output"
            if not folder.is_dir() or not any(folder.iterdir()):
                return f"nothing of /pai/output was uploaded to {target}: {budget.stopped}" if budget.stopped else None
            size = storage.upload_tree(folder, target, reader=reader)
        except (storage.StorageError, tarfile.TarError, OSError) as exc:
            return f"could not upload /pai/output to {target}: {exc}"
        finally:
            getattr(stream, "close", lambda: None)()
    if budget.stopped:
        return (f"uploaded {budget.kept_files} files of /pai/output ({size} bytes) to {target}; "
                f"the rest was not uploaded: {budget.stopped}")
    return f"uploaded /pai/output ({size} bytes) to {target}"


def _extract_within(stream: Iterable[bytes], dest: Path, budget: _Budget) -> None:
    """Extract folders and regular files while they fit the budget; stop
    reading at the first file that does not (the rest never reaches disk)."""
    with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as archive:
        for member in archive:
            if member.isdir():
                archive.extract(member, dest, filter="data")
            elif member.isreg():
                if budget.kept_files + 1 > budget.max_files:
                    budget.stopped = f"/pai/{member.name} would pass {budget.files_why}"
                    return
                if budget.kept_bytes + member.size > budget.max_bytes:
                    budget.stopped = f"/pai/{member.name} ({member.size} bytes) would pass {budget.bytes_why}"
                    return
                archive.extract(member, dest, filter="data")
                budget.kept_files += 1
                budget.kept_bytes += member.size
            # links and devices: never uploaded (upload_tree skips symlinks too)


class _ChunkReader:
    """A file-like reader over an iterator of byte chunks (for tarfile)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            try:
                self._buffer += next(self._chunks)
            except StopIteration:
                break
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data
