"""The file system behind tests/webhdfs_server.py: bytes in a folder,
HDFS-style owners and permission bits in memory, RemoteException errors."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPERUSER = "hdfs"
SUPERGROUP = "supergroup"
STATIC_WEB_USER = "dr.who"

_EXCEPTIONS = {  # exception -> (HTTP status, Java class)
    "IllegalArgumentException": (400, "java.lang.IllegalArgumentException"),
    "UnsupportedOperationException": (400, "java.lang.UnsupportedOperationException"),
    "SecurityException": (401, "java.lang.SecurityException"),
    "AccessControlException": (403, "org.apache.hadoop.security.AccessControlException"),
    "AuthorizationException": (403, "org.apache.hadoop.security.authorize.AuthorizationException"),
    "FileAlreadyExistsException": (403, "org.apache.hadoop.fs.FileAlreadyExistsException"),
    "PathIsNotEmptyDirectoryException": (403, "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException"),
    "ParentNotDirectoryException": (403, "org.apache.hadoop.fs.ParentNotDirectoryException"),
    "IOException": (403, "java.io.IOException"),
    "FileNotFoundException": (404, "java.io.FileNotFoundException"),
    "RuntimeException": (500, "java.lang.RuntimeException"),
}


class RemoteException(Exception):
    def __init__(self, exception: str, message: str) -> None:
        super().__init__(message)
        self.exception = exception
        self.message = message

    def body(self) -> tuple[int, dict[str, Any]]:
        status, java = _EXCEPTIONS[self.exception]
        return status, {"RemoteException": {"exception": self.exception, "javaClassName": java, "message": self.message}}


@dataclass
class Inode:
    owner: str
    group: str
    permission: int  # e.g. 0o755


@dataclass
class Namespace:
    """The file system: bytes under `root`, ownership and modes in `inodes`."""

    root: Path
    inodes: dict[str, Inode] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.inodes["/"] = Inode(SUPERUSER, SUPERGROUP, 0o755)

    def local(self, path: str) -> Path:
        return self.root.joinpath(*[p for p in path.split("/") if p])

    def exists(self, path: str) -> bool:
        return self.local(path).exists()

    def is_dir(self, path: str) -> bool:
        return self.local(path).is_dir()

    def inode(self, path: str) -> Inode:
        return self.inodes.setdefault(path, Inode(SUPERUSER, SUPERGROUP, 0o755 if self.is_dir(path) else 0o644))

    # ------------------------------------------------------------ permissions

    def check(self, user: str, path: str, access: str) -> None:
        """HDFS's FSPermissionChecker in small: EXECUTE on every ancestor,
        then `access` (a subset of "rwx") on the path itself. A file in the
        middle of the path is ParentNotDirectoryException, for everyone."""
        for ancestor in _ancestors(path):
            if self.exists(ancestor) and not self.is_dir(ancestor):
                raise RemoteException("ParentNotDirectoryException", f"{ancestor} (is not a directory)")
            if user == SUPERUSER:
                continue
            if self.exists(ancestor) and not self._allows(user, ancestor, "x"):
                self._deny(user, ancestor, "EXECUTE")
        if user != SUPERUSER and access and self.exists(path) and not self._allows(user, path, access):
            self._deny(user, path, {"r": "READ", "w": "WRITE", "x": "EXECUTE", "rx": "READ_EXECUTE", "wx": "WRITE_EXECUTE"}[access])

    def _allows(self, user: str, path: str, access: str) -> bool:
        inode = self.inode(path)
        shift = 6 if inode.owner == user else 0  # no groups: users are in none but their own
        bits = {"r": 4, "w": 2, "x": 1}
        return all(inode.permission >> shift & bits[c] for c in access)

    def _deny(self, user: str, path: str, access: str) -> None:
        inode = self.inode(path)
        kind = "d" if self.is_dir(path) else "-"
        raise RemoteException(
            "AccessControlException",
            f'Permission denied: user={user}, access={access}, inode="{path}":{inode.owner}:{inode.group}:'
            f"{kind}{_mode_string(inode.permission)}",
        )

    def nearest_existing(self, path: str) -> str:
        while not self.exists(path):
            path = parent(path)
        return path

    # ---------------------------------------------------------------- status

    def status(self, path: str, suffix: str) -> dict[str, Any]:
        local = self.local(path)
        info = local.stat()
        inode = self.inode(path)
        is_dir = local.is_dir()
        return {
            "accessTime": 0 if is_dir else int(info.st_atime * 1000),
            "blockSize": 0 if is_dir else 134217728,
            "childrenNum": len(list(local.iterdir())) if is_dir else 0,
            "fileId": info.st_ino,
            "group": inode.group,
            "length": 0 if is_dir else info.st_size,
            "modificationTime": int(info.st_mtime * 1000),
            "owner": inode.owner,
            "pathSuffix": suffix,
            "permission": format(inode.permission, "o"),
            "replication": 0 if is_dir else 3,
            "storagePolicy": 0,
            "type": "DIRECTORY" if is_dir else "FILE",
        }

    def mkdirs(self, user: str, path: str, permission: int) -> None:
        existing = self.nearest_existing(path)
        if not self.is_dir(existing):
            raise RemoteException("ParentNotDirectoryException", f"{existing} (is not a directory)")
        if existing == path:
            return
        self.check(user, existing, "wx")
        for ancestor in [*_ancestors(path), path]:
            if not self.exists(ancestor):
                self.local(ancestor).mkdir()
                self.inodes[ancestor] = Inode(user, SUPERGROUP, permission)


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def join_path(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name


def _ancestors(path: str) -> list[str]:
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _mode_string(permission: int) -> str:
    return "".join(c if permission >> (8 - i) & 1 else "-" for i, c in enumerate("rwxrwxrwx"))
