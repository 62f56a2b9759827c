"""Files between storage and a node: a job's codeDir fetched into a stage
folder on the node (mounted read-only at /pai/code), its dataDir likewise
(at /pai/data, up to DATA_DIR_MAX_MB), and what a task left in /pai/output
copied to the job's outputDir when its container ends.

Stage folders live under stage_root(node): one per job attempt,
`job-<job id>-<attempt number>`; the agent removes those of attempts that
are over when it reconciles.

When storage does not answer as a task ends (the namenode is down), its
/pai/output stays in the stopped container, which the watcher removes only
after upload_output returns: the upload is tried again with a growing pause
for OUTPUT_UPLOAD_RETRY_SECONDS, the task's platform log saying so. If it
still fails, or the job is stopped meanwhile, the output is copied to
kept_root() on the node and kept there OUTPUT_KEEP_HOURS (the node agent
removes older ones each time it reconciles), and the platform log says
where.
"""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings

from jobs import storage
from jobs.models import ExitType, Job
from jobs.node.launcher import Engine, LaunchError
from jobs.spec import JobSpec
from jobs.storage.paths import MAX_DEPTH as MAX_STORAGE_DEPTH

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
    """Fetches codeDir (and dataDir) once per job attempt and node; later
    tasks reuse the copy."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def stage(self, folder: Path, code_dir: str, *, reader: storage.Reader | None = None) -> tuple[str, int | None]:
        """The host folder holding `code_dir`, and its size in bytes if it
        was fetched now (None: an earlier task fetched it). Raises LaunchError."""
        def fetch(partial: Path) -> int:
            return storage.stage_tree(code_dir, partial, max_bytes=settings.CODE_DIR_MAX_MB * MB, reader=reader)
        return self._once(folder / "code", fetch, what=f"codeDir {code_dir}")

    def stage_data(self, folder: Path, data_dir: str, *, reader: storage.Reader | None = None) -> tuple[str, str]:
        """(host folder to mount at /pai/data or "", a note for the task's
        platform log or ""). A missing dataDir, or one larger than
        DATA_DIR_MAX_MB, is not copied: the task still has $PAI_DATA_DIR
        to read it from. Raises LaunchError when storage fails."""
        limit = settings.DATA_DIR_MAX_MB * MB
        if limit == 0:
            return "", ""
        outcome: list[str] = []

        def fetch(partial: Path) -> int | None:
            try:
                size, copied = storage.stage_data(data_dir, partial, max_bytes=limit, reader=reader)
            except storage.StorageNotFound:
                outcome.append(f"dataDir {data_dir} does not exist: nothing is mounted at /pai/data")
                return None
            if not copied:
                outcome.append(f"dataDir {data_dir} holds {size / MB:.0f} MB, more than DATA_DIR_MAX_MB "
                               f"({settings.DATA_DIR_MAX_MB} MB): not copied to /pai/data; read it from $PAI_DATA_DIR")
                return None
            return size

        path, size = self._once(folder / "data", fetch, what=f"dataDir {data_dir}")
        if outcome:
            return "", outcome[0]
        if not path:
            return "", ""  # an earlier task found nothing to copy and said so
        return path, "" if size is None else f"copied dataDir {data_dir} ({size} bytes) to /pai/data"

    def _once(self, target: Path, fetch: Callable[[Path], int | None], *, what: str) -> tuple[str, int | None]:
        """Run `fetch` into a side folder once for `target`; ("", None) when
        it fetched nothing (now or before)."""
        with self._guard:
            lock = self._locks.setdefault(str(target), threading.Lock())
        with lock:
            done, empty = target.with_name(f".{target.name}.complete"), target.with_name(f".{target.name}.none")
            if done.exists():
                return str(target), None
            if empty.exists():
                return "", None
            # Fetched into a side folder and renamed, so a crash mid-fetch
            # never leaves a half copy that looks complete.
            partial = target.with_name(f"{target.name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                size = fetch(partial)
            except storage.StorageError as exc:
                shutil.rmtree(partial, ignore_errors=True)
                raise LaunchError(ExitType.PLATFORM, f"could not fetch {what}: {exc}") from None
            if size is None:
                shutil.rmtree(partial, ignore_errors=True)
                empty.touch()
                return "", None
            _readable_in_containers(partial)
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
            done.touch()
            return str(target), size


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


def kept_root() -> Path:
    """Where outputs that could not be uploaded are kept on this machine
    (beside the nodes' stage roots, which the agent cleans by job attempt)."""
    return settings.STAGE_DIR / settings.PAI_INSTANCE / "kept-output"


def expire_kept_outputs(*, now: float | None = None) -> None:
    """Remove kept outputs older than OUTPUT_KEEP_HOURS (the node agent
    calls this every RECONCILE_SECONDS)."""
    root = kept_root()
    if not root.is_dir():
        return
    oldest = (now or time.time()) - settings.OUTPUT_KEEP_HOURS * 3600
    for folder in root.iterdir():
        try:
            if folder.stat().st_mtime < oldest:
                shutil.rmtree(folder, ignore_errors=True)
        except FileNotFoundError:
            continue  # another agent of this machine removed it


def upload_output(engine: Engine, container_id: str, target: str, *, reader: storage.Reader | None = None,
                  note: Callable[[str], None] | None = None,
                  stopped: threading.Event | None = None) -> str | None:
    """Copy what the stopped task left in /pai/output to `target`, as far as
    the limits allow: whole files in the archive's order until the first one
    that would pass a limit; it and the files after it are left out (never
    half a file). Returns what happened, for the task's platform log; None
    if there was nothing.

    While storage does not answer, tries again after 2, 4, 8 ... (at most
    60) seconds for OUTPUT_UPLOAD_RETRY_SECONDS, telling `note` each time;
    the output waits in the container meanwhile. Then keeps a copy on the
    node (kept_root) and says where. Once `stopped` is set (the user
    stopped the job) it tries no more and keeps the copy at once: a stop
    ends the task now, not at the end of the retry time."""
    stopped = stopped or threading.Event()
    deadline = time.monotonic() + settings.OUTPUT_UPLOAD_RETRY_SECONDS
    pause, tries = 2.0, 0
    while True:
        tries += 1
        try:
            return _upload_once(engine, container_id, target, reader=reader)
        except storage.StorageUnavailable as exc:
            failed = exc
        if stopped.is_set():
            break
        if time.monotonic() + pause > deadline:
            return _keep_on_node(engine, container_id, target, f"{failed}; tried {tries} times over "
                                 f"{settings.OUTPUT_UPLOAD_RETRY_SECONDS} s (OUTPUT_UPLOAD_RETRY_SECONDS)")
        if note is not None:
            note(f"could not upload /pai/output to {target}: {failed}; /pai/output is kept, "
                 f"trying again in {pause:.0f} s")
        if stopped.wait(pause):
            break
        pause = min(pause * 2, 60.0)
    return _keep_on_node(engine, container_id, target, f"{failed}; tried {tries} times, then the job was stopped")


def _upload_once(engine: Engine, container_id: str, target: str, *, reader: storage.Reader | None) -> str | None:
    """One try; raises StorageUnavailable when storage did not answer."""
    stream = engine.archive(container_id, "/pai/output")
    if stream is None:
        return None
    (settings.VAR_DIR / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.VAR_DIR / "tmp") as tmp:
        try:
            budget = _output_budget(target)
            _extract_within(stream, Path(tmp), budget)
            folder = Path(tmp) / "output"
            if not folder.is_dir() or not any(folder.iterdir()):
                return f"nothing of /pai/output was uploaded to {target}: {budget.stopped}" if budget.stopped else None
            size = storage.upload_tree(folder, target, reader=reader)
        except storage.StorageUnavailable:
            raise
        except (storage.StorageError, tarfile.TarError, OSError) as exc:
            return f"could not upload /pai/output to {target}: {exc}"
        finally:
            getattr(stream, "close", lambda: None)()
    if budget.stopped:
        return (f"uploaded {budget.kept_files} files of /pai/output ({size} bytes) to {target}; "
                f"the rest was not uploaded: {budget.stopped}")
    return f"uploaded /pai/output ({size} bytes) to {target}"


def _keep_on_node(engine: Engine, container_id: str, target: str, why: str) -> str:
    """Copy /pai/output (within the per-task limits; the quota cannot be
    asked) into kept_root(), for an admin to upload by hand."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", target.split("://", 1)[-1]).strip("_")[:120]
    kept = kept_root() / f"{name}-{container_id[:12]}"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    until = (datetime.now(UTC) + timedelta(hours=settings.OUTPUT_KEEP_HOURS)).strftime("%Y-%m-%d %H:%M UTC")
    stream = engine.archive(container_id, "/pai/output")
    try:
        budget = _Budget(settings.OUTPUT_MAX_MB_PER_TASK * MB, settings.OUTPUT_MAX_FILES_PER_TASK, "", "")
        if stream is not None:
            _extract_within(stream, kept, budget)
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(kept, ignore_errors=True)
        return f"could not upload /pai/output to {target}: {why}; keeping it on the node failed too: {exc}"
    finally:
        getattr(stream, "close", lambda: None)()
    return (f"could not upload /pai/output to {target}: {why}. It is kept on this task's node in {kept / 'output'} "
            f"until {until} (OUTPUT_KEEP_HOURS); ask an admin to copy it to outputDir")


def _extract_within(stream: Iterable[bytes], dest: Path, budget: _Budget) -> None:
    """Extract folders and regular files while they fit the budget; stop
    reading at the first file that does not (the rest never reaches disk)."""
    with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as archive:
        for member in archive:
            if member.isdir():
                _member_path(dest, member.name).mkdir(parents=True, exist_ok=True)
            elif member.isreg():
                if budget.kept_files + 1 > budget.max_files:
                    budget.stopped = f"/pai/{member.name} would pass {budget.files_why}"
                    return
                if budget.kept_bytes + member.size > budget.max_bytes:
                    budget.stopped = f"/pai/{member.name} ({member.size} bytes) would pass {budget.bytes_why}"
                    return
                _extract_file(archive, member, _member_path(dest, member.name))
                budget.kept_files += 1
                budget.kept_bytes += member.size
            # links and devices: never uploaded (upload_tree skips symlinks too)


# Written out rather than left to extract(filter="data"): Debian 12's own
# Python (3.11.2) has no extraction filters, and the task's archive is the
# task's to forge. Only folders and regular files are ever made, under a
# fresh `dest`, so a name is the only way out of it.
def _member_path(dest: Path, name: str) -> Path:
    """Where the member `name` goes under `dest`; TarError for a name that
    would leave it (absolute, or climbing with "..")."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or ".." in parts or not parts:
        raise tarfile.TarError(f"/pai/{name}: the archive names a place outside /pai/output")
    # No storage path is that deep (MAX_STORAGE_DEPTH), and a tree of a
    # thousand levels would break Python's own walks of it (rmtree, rglob).
    if len(parts) > MAX_STORAGE_DEPTH:
        raise tarfile.TarError(f"/pai/{name[:80]}…: more than {MAX_STORAGE_DEPTH} folders deep, "
                               "deeper than storage takes")
    return dest.joinpath(*parts)


def _extract_file(archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    """The file's bytes, with its permissions less what a shared folder must
    not get (set-id bits, writable by others)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    source = archive.extractfile(member)
    if source is None:
        raise tarfile.TarError(f"/pai/{member.name}: its content cannot be read")
    with source, open(target, "wb") as out:
        shutil.copyfileobj(source, out, MB)
    target.chmod((member.mode & 0o755) | 0o600)


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
