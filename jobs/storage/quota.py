"""Per-user storage quotas: STORAGE_QUOTA_MB and STORAGE_QUOTA_FILES over a
user's home /<user> and their outputs /Output/<user> together.

Every write into those folders through this package is checked first: the
storage page's uploads (files.files_save) and a task's /pai/output upload
(storage.upload_tree; the node uploads what fits, staging.py). Making
folders is free. Shared folders and the top are nobody's: only admins write
there.

How usage is known: the backend measures the two folders (local disk: one
walk summing file sizes; HDFS: the namenode's content summary, one request
per folder). A measurement is kept in the cache (Redis, shared by the web
processes and node agents) for STORAGE_USAGE_CACHE_SECONDS, and every write
through this package adds what it stored, so a burst of uploads walks a
home once, not once per upload. A delete forgets the measurement (the next
check measures again), as does a write cut short part-way (some files
stored, the rest not). Files that appear another way (an HDFS client, a
shell on the storage host) count once the kept value expires. Writes
checked at the same moment are each checked without the others: N of them
can together pass the quota by up to N - 1 uploads (each within the
per-file limit), since the check and the write are not one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from jobs.storage.access import OUTPUT_FOLDER
from jobs.storage.errors import StorageQuotaExceeded

MB = 1024 * 1024


@dataclass(frozen=True)
class Usage:
    bytes: int
    files: int


def owner_of(path: str) -> str | None:
    """Whose quota a storage path uses: /<user>/... and /Output/<user>/...
    are <user>'s; shared folders and the top are nobody's."""
    parts = [part for part in path.split("/") if part]
    if not parts or parts[0] in settings.STORAGE_SHARED_FOLDERS:
        return None
    if parts[0] == OUTPUT_FOLDER:
        return parts[1] if len(parts) > 1 else None
    return parts[0]


def limits() -> Usage | None:
    """The quota (0 in a setting: no limit on that), None when there is none."""
    if not settings.STORAGE_QUOTA_MB and not settings.STORAGE_QUOTA_FILES:
        return None
    return Usage(settings.STORAGE_QUOTA_MB * MB, settings.STORAGE_QUOTA_FILES)


def _keys(user_name: str) -> tuple[str, str]:
    return f"storage-usage:{user_name}:bytes", f"storage-usage:{user_name}:files"


def usage_of(user_name: str) -> Usage:
    """What the user's home and outputs hold (kept a while, see above)."""
    from jobs.storage import backend  # the package imports this module

    bytes_key, files_key = _keys(user_name)
    kept = cache.get_many([bytes_key, files_key])
    if len(kept) == 2:
        return Usage(kept[bytes_key], kept[files_key])
    used = [backend().usage(folder) for folder in (f"/{user_name}", f"/{OUTPUT_FOLDER}/{user_name}")]
    usage = Usage(sum(u[0] for u in used), sum(u[1] for u in used))
    if settings.STORAGE_USAGE_CACHE_SECONDS:
        cache.set_many({bytes_key: usage.bytes, files_key: usage.files}, timeout=settings.STORAGE_USAGE_CACHE_SECONDS)
    return usage


def room_for(user_name: str | None) -> Usage | None:
    """How much more the user may store (None: no limit applies)."""
    quota = limits()
    if user_name is None or quota is None:
        return None
    used = usage_of(user_name)
    huge = 1 << 62
    return Usage(max(0, quota.bytes - used.bytes) if quota.bytes else huge,
                 max(0, quota.files - used.files) if quota.files else huge)


def check_room(user_name: str | None, *, adding_bytes: int, adding_files: int) -> None:
    """Raise StorageQuotaExceeded, saying what is used, if the write does not fit."""
    room = room_for(user_name)
    if room is None or (adding_bytes <= room.bytes and adding_files <= room.files):
        return
    raise StorageQuotaExceeded(quota_message(user_name, adding_bytes=adding_bytes, adding_files=adding_files))


def quota_message(user_name: str, *, adding_bytes: int, adding_files: int) -> str:
    quota, used = limits(), usage_of(user_name)
    allowed = []
    if quota.bytes:
        allowed.append(f"{_size(quota.bytes)} (STORAGE_QUOTA_MB)")
    if quota.files:
        allowed.append(f"{quota.files} files (STORAGE_QUOTA_FILES)")
    return (f"storage quota exceeded: /{user_name} and /{OUTPUT_FOLDER}/{user_name} hold {_size(used.bytes)} in "
            f"{used.files} files, this would add {_size(adding_bytes)} in {adding_files} files, and the quota is "
            f"{' and '.join(allowed)}; delete files to make room")


def note_written(user_name: str | None, *, added_bytes: int, added_files: int) -> None:
    """Add a write to the kept usage (nothing kept: the next check measures)."""
    if user_name is None:
        return
    for key, amount in zip(_keys(user_name), (added_bytes, added_files)):
        try:
            cache.incr(key, amount)
        except ValueError:  # not kept (expired, or never measured)
            pass


def forget(user_name: str | None) -> None:
    if user_name is not None:
        cache.delete_many(list(_keys(user_name)))


def _size(size: int) -> str:
    return f"{size / MB:.1f} MB" if size >= MB / 10 or size == 0 else f"{size} bytes"
