"""Who may read and write which storage paths. Pure: no I/O.

- "/<user>" is the user's home: read and write.
- "/Output/<user>" holds the reference default outputDir
  ($PAI_DEFAULT_FS_URI/Output/<user>/<jobName>): read and write for <user>.
- Each shared folder ("/shared" by default): everyone reads, admins write.
- Admins may read and write everything.
- "/" and "/Output" can be listed (a listing shows only what the reader may
  open) but not written.

The Output tree and shared folders come before homes, so a user called
"Output" or "shared" gets no power over them (their home is not browsable;
their outputs still live in /Output/<name>). Deleting needs write access to
the path and to its parent, so nobody but an admin deletes a home, an
/Output/<user> folder or a shared folder itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.storage.errors import StorageAccessDenied
from jobs.storage.paths import ROOT, parent

OUTPUT_FOLDER = "Output"


@dataclass(frozen=True)
class Reader:
    """Whoever is asking: a user name, whether an admin, the shared folders."""

    name: str
    is_admin: bool
    shared: tuple[str, ...]

    @property
    def home(self) -> str:
        return f"/{self.name}"

    @property
    def output_home(self) -> str:
        return f"/{OUTPUT_FOLDER}/{self.name}"


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _home_is_reserved(reader: Reader) -> bool:
    return reader.name == OUTPUT_FOLDER or reader.name in reader.shared


def may_read(reader: Reader, path: str) -> bool:
    if reader.is_admin:
        return True
    parts = _parts(path)
    if not parts or parts == [OUTPUT_FOLDER]:
        return True  # listable tops: a listing shows only what the reader may open
    if parts[0] in reader.shared:
        return True
    return may_write(reader, path)


def may_write(reader: Reader, path: str) -> bool:
    if reader.is_admin:
        return True
    parts = _parts(path)
    if not parts:
        return False
    if parts[0] == OUTPUT_FOLDER:
        return len(parts) >= 2 and parts[1] == reader.name
    if parts[0] in reader.shared:
        return False
    return parts[0] == reader.name and not _home_is_reserved(reader)


def may_delete(reader: Reader, path: str) -> bool:
    return path != ROOT and may_write(reader, path) and may_write(reader, parent(path))


def where_allowed(reader: Reader, *, write: bool) -> str:
    """A sentence for error messages: the places this reader may use."""
    if reader.is_admin:
        return "any path"
    mine = [reader.output_home] if _home_is_reserved(reader) else [reader.home, reader.output_home]
    places = f"your folders {' and '.join(mine)}"
    if not write and reader.shared:
        places += " or the shared folder" + ("s " if len(reader.shared) > 1 else " ") + ", ".join(f"/{s}" for s in reader.shared)
    return places


def check_read(reader: Reader, path: str) -> None:
    if not may_read(reader, path):
        raise StorageAccessDenied(f"you may not read {path}; expected a path in {where_allowed(reader, write=False)}")


def check_write(reader: Reader, path: str) -> None:
    if not may_write(reader, path):
        raise StorageAccessDenied(f"you may not write to {path}; expected a path in {where_allowed(reader, write=True)}")


def check_delete(reader: Reader, path: str) -> None:
    if not may_delete(reader, path):
        raise StorageAccessDenied(f"you may not delete {path}: only files and folders inside "
                                  f"{where_allowed(reader, write=True)} can be deleted")
