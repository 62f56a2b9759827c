"""A WebHDFS server for tests: a namenode and a datanode on 127.0.0.1.

No Hadoop can run on the test machines, so the WebHDFS backend is tested
against this: real HTTP servers in threads, backed by a temporary folder,
following Apache's WebHDFS REST documentation
(hadoop-project-dist/hadoop-hdfs/WebHDFS.html):

- URLs are http://<host>:<port>/webhdfs/v1/<PATH>?op=...; `user.name` names
  the caller when security is off; without it the caller is the static web
  user "dr.who". `doas=<user>` makes the request that user's, when the
  caller is one of the server's `proxy_users` (else AuthorizationException).
- CREATE (PUT), APPEND (POST) and OPEN (GET) on the namenode answer
  "307 Temporary Redirect" with a Location on the datanode; the data goes to
  (or comes from) the datanode, which answers 201 Created (with a webhdfs://
  Location), 200 OK, or the file's bytes. Bodies arrive with a Content-Length
  or chunked.
- GETFILESTATUS, LISTSTATUS (a file lists itself, pathSuffix ""),
  LISTSTATUS_BATCH (DirectoryListing: partialListing, remainingEntries),
  GETHOMEDIRECTORY, MKDIRS, RENAME, DELETE, SETPERMISSION, SETOWNER answer
  JSON: FileStatus / FileStatuses / Path / boolean.
- Errors are RemoteException JSON bodies with exception, javaClassName and
  message, and the documented status codes: IllegalArgumentException and
  UnsupportedOperationException 400, SecurityException 401, IOException
  (AccessControlException, FileAlreadyExistsException,
  PathIsNotEmptyDirectoryException ...) 403, FileNotFoundException 404,
  RuntimeException 500.
- HDFS permissions: owner/group/other rwx bits, WRITE+EXECUTE on the parent
  to create or delete, READ+EXECUTE to list, READ to open, EXECUTE on every
  ancestor; new files 644 and folders 755; the superuser (who started the
  namenode, "hdfs" here) passes every check.

What it does not model: blocks, replication, leases, checksums, snapshots,
xattrs/ACLs, delegation tokens, Kerberos (SPNEGO), HA namenodes.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from tests.webhdfs_namespace import (
    STATIC_WEB_USER, SUPERGROUP, SUPERUSER, Inode, Namespace, RemoteException, join_path, parent,
)

PREFIX = "/webhdfs/v1"
LIST_BATCH = 1000  # entries a LISTSTATUS_BATCH answer holds at most (HDFS's dfs.ls.limit)


@dataclass
class Request:
    method: str
    op: str
    path: str
    user: str
    server: str  # "namenode" or "datanode"


class WebHdfsServer:
    """Start with `start()`, stop with `stop()`; `url` is the namenode's."""

    def __init__(self, *, proxy_users: frozenset[str] = frozenset()) -> None:
        self.proxy_users = proxy_users
        self._folder = tempfile.mkdtemp(prefix="webhdfs-test-")
        self.fs = Namespace(Path(self._folder))
        self.requests: list[Request] = []
        self.namenode = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "namenode"))
        self.datanode = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "datanode"))
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.namenode, self.datanode)]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.namenode.server_address[1]}"

    @property
    def datanode_address(self) -> str:
        return f"127.0.0.1:{self.datanode.server_address[1]}"

    def start(self) -> WebHdfsServer:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for server in (self.namenode, self.datanode):
            server.shutdown()
            server.server_close()
        shutil.rmtree(self._folder, ignore_errors=True)


def _handler(server: WebHdfsServer, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(_WebHdfsHandler):
        pass

    Handler.server_state = server
    Handler.role = role
    return Handler


class _WebHdfsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: WebHdfsServer
    role: str

    def log_message(self, format: str, *args: Any) -> None:  # quiet in tests
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # ---------------------------------------------------------------- plumbing

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
        body = self._read_body()
        if not url.path.startswith(PREFIX):
            self._send(404, b"Not Found", "text/plain")
            return
        path = "/" + "/".join(p for p in unquote(url.path[len(PREFIX):]).split("/") if p)
        user = query.get("user.name") or STATIC_WEB_USER
        op = query.get("op", "").upper()
        try:
            if query.get("doas"):
                if user not in self.server_state.proxy_users:
                    raise RemoteException("AuthorizationException", f"User: {user} is not allowed to impersonate {query['doas']}")
                user = query["doas"]
            self.server_state.requests.append(Request(method, op, path, user, self.role))
            if ".." in path.split("/"):
                raise RemoteException("IllegalArgumentException", f"Invalid path name {path}")
            ops = _NAMENODE_OPS if self.role == "namenode" else _DATANODE_OPS
            if (method, op) not in ops:
                known = {name for _, name in ops}
                if op in known:
                    raise RemoteException("IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": {op} is not a {method} operation")
                raise RemoteException("IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": No enum constant {op}")
            with self.server_state.fs.lock:
                getattr(self, ops[(method, op)])(path, user, query, body)
        except RemoteException as exc:
            status, payload = exc.body()
            self._json(status, payload)
        except ValueError as exc:
            status, payload = RemoteException("IllegalArgumentException", str(exc)).body()
            self._json(status, payload)
        except Exception as exc:  # a bug here: answer as Hadoop would, and let the test see it
            status, payload = RemoteException("RuntimeException", f"{type(exc).__name__}: {exc}").body()
            self._json(status, payload)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _redirect(self, path: str, user: str, query: dict[str, str]) -> None:
        """307 to the datanode, as the namenode does for CREATE/APPEND/OPEN."""
        params = {k: v for k, v in query.items() if k != "user.name"}  # doas stays
        params.update({"namenoderpcaddress": "127.0.0.1:9000", "user.name": query.get("user.name") or user})
        location = f"http://{self.server_state.datanode_address}{PREFIX}{quote(path)}?{urlencode(params)}"
        self._send(307, b"", "application/octet-stream", {"Location": location})

    @property
    def fs(self) -> Namespace:
        return self.server_state.fs

    def _require(self, path: str) -> None:
        if not self.fs.exists(path):
            raise RemoteException("FileNotFoundException", f"File does not exist: {path}")

    # ------------------------------------------------------- namenode: reads

    def nn_getfilestatus(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self.fs.check(user, path, "")
        self._require(path)
        self._json(200, {"FileStatus": self.fs.status(path, "")})

    def nn_liststatus(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self.fs.check(user, path, "")
        self._require(path)
        if not self.fs.is_dir(path):
            statuses = [self.fs.status(path, "")]
        else:
            self.fs.check(user, path, "rx")
            names = sorted(child.name for child in self.fs.local(path).iterdir())
            statuses = [self.fs.status(join_path(path, name), name) for name in names]
        self._json(200, {"FileStatuses": {"FileStatus": statuses}})

    def nn_liststatus_batch(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        """LISTSTATUS in batches of LIST_BATCH (HDFS's dfs.ls.limit), from
        the name after `startAfter`, with how many entries remain."""
        self.fs.check(user, path, "")
        self._require(path)
        if not self.fs.is_dir(path):
            statuses, remaining = [self.fs.status(path, "")], 0
        else:
            self.fs.check(user, path, "rx")
            after = query.get("startAfter", "")
            names = sorted(child.name for child in self.fs.local(path).iterdir() if child.name > after)
            statuses = [self.fs.status(join_path(path, name), name) for name in names[:LIST_BATCH]]
            remaining = max(0, len(names) - LIST_BATCH)
        self._json(200, {"DirectoryListing": {"partialListing": {"FileStatuses": {"FileStatus": statuses}},
                                              "remainingEntries": remaining}})

    def nn_getcontentsummary(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self.fs.check(user, path, "")
        self._require(path)
        root = self.fs.local(path)
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        folders = 0 if root.is_file() else 1 + sum(1 for p in root.rglob("*") if p.is_dir())
        length = sum(p.stat().st_size for p in files)
        self._json(200, {"ContentSummary": {"directoryCount": folders, "fileCount": len(files), "length": length,
                                            "quota": -1, "spaceConsumed": length, "spaceQuota": -1}})

    def nn_gethomedirectory(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self._json(200, {"Path": f"/user/{user}"})

    def nn_open(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self.fs.check(user, path, "r")
        self._require(path)
        if self.fs.is_dir(path):
            raise RemoteException("FileNotFoundException", f"Path is not a file: {path}")
        self._redirect(path, user, query)

    # ------------------------------------------------------ namenode: writes

    def nn_create(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        _permission(query, 0o644)
        _boolean(query, "overwrite")
        self._redirect(path, user, query)  # the datanode creates the file

    def nn_append(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self._require(path)
        self.fs.check(user, path, "w")
        self._redirect(path, user, query)

    def nn_mkdirs(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self.fs.check(user, path, "")
        if self.fs.exists(path) and not self.fs.is_dir(path):
            raise RemoteException("FileAlreadyExistsException", f"Path is not a directory: {path}")
        self.fs.mkdirs(user, path, _permission(query, 0o755))
        self._json(200, {"boolean": True})

    def nn_delete(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        recursive = _boolean(query, "recursive")
        if not self.fs.exists(path):
            self._json(200, {"boolean": False})
            return
        if path == "/":
            self._json(200, {"boolean": False})  # HDFS never deletes its root
            return
        self.fs.check(user, parent(path), "wx")
        local = self.fs.local(path)
        if local.is_dir():
            if any(local.iterdir()) and not recursive:
                raise RemoteException("PathIsNotEmptyDirectoryException", f"`{path} is non empty': Directory is not empty")
            for inner in [p for p in self.fs.inodes if p.startswith(path + "/")]:
                self.fs.check(user, inner, "")  # every folder inside must be passable
            shutil.rmtree(local)
        else:
            local.unlink()
        for key in [p for p in self.fs.inodes if p == path or p.startswith(path + "/")]:
            del self.fs.inodes[key]
        self._json(200, {"boolean": True})

    def nn_rename(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        destination = query.get("destination", "")
        if not destination.startswith("/"):
            raise RemoteException("IllegalArgumentException", f"Invalid value for webhdfs parameter \"destination\": {destination}")
        if not self.fs.exists(path) or self.fs.exists(destination) or not self.fs.is_dir(parent(destination)):
            self._json(200, {"boolean": False})
            return
        self.fs.check(user, parent(path), "wx")
        self.fs.check(user, parent(destination), "wx")
        self.fs.local(path).rename(self.fs.local(destination))
        for key in [p for p in list(self.fs.inodes) if p == path or p.startswith(path + "/")]:
            self.fs.inodes[destination + key[len(path):]] = self.fs.inodes.pop(key)
        self._json(200, {"boolean": True})

    def nn_setpermission(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self._require(path)
        self._owner_or_super(user, path)
        self.fs.inode(path).permission = _permission(query, 0o755)
        self._send(200, b"", "application/octet-stream")

    def nn_setowner(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self._require(path)
        if user != SUPERUSER:
            raise RemoteException("AccessControlException", f"Non-super user cannot change owner of {path}")
        inode = self.fs.inode(path)
        inode.owner = query.get("owner") or inode.owner
        inode.group = query.get("group") or inode.group
        self._send(200, b"", "application/octet-stream")

    def _owner_or_super(self, user: str, path: str) -> None:
        if user not in (SUPERUSER, self.fs.inode(path).owner):
            raise RemoteException("AccessControlException", f"Permission denied. user={user} is not the owner of inode={path}")

    # --------------------------------------------------------------- datanode

    def dn_create(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        overwrite = _boolean(query, "overwrite")
        if self.fs.exists(path):
            if self.fs.is_dir(path):
                raise RemoteException("FileAlreadyExistsException", f"{path} already exists as a directory")
            if not overwrite:
                raise RemoteException("FileAlreadyExistsException", f"{path} for client 127.0.0.1 already exists")
            self.fs.check(user, parent(path), "wx")
        folder = parent(path)
        self.fs.check(user, self.fs.nearest_existing(folder), "wx")
        self.fs.mkdirs(user, folder, 0o755)
        self.fs.local(path).write_bytes(body)
        self.fs.inodes[path] = Inode(user, SUPERGROUP, _permission(query, 0o644))
        self._send(201, b"", "application/octet-stream", {"Location": f"webhdfs://127.0.0.1:9870{quote(path)}"})

    def dn_append(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        with self.fs.local(path).open("ab") as out:
            out.write(body)
        self._send(200, b"", "application/octet-stream")

    def dn_open(self, path: str, user: str, query: dict[str, str], body: bytes) -> None:
        self._require(path)
        data = self.fs.local(path).read_bytes()
        offset = int(query.get("offset") or 0)
        length = query.get("length")
        data = data[offset:offset + int(length)] if length else data[offset:]
        self._send(200, data, "application/octet-stream")


_NAMENODE_OPS = {
    ("GET", "GETFILESTATUS"): "nn_getfilestatus", ("GET", "LISTSTATUS"): "nn_liststatus",
    ("GET", "LISTSTATUS_BATCH"): "nn_liststatus_batch",
    ("GET", "GETHOMEDIRECTORY"): "nn_gethomedirectory", ("GET", "OPEN"): "nn_open",
    ("GET", "GETCONTENTSUMMARY"): "nn_getcontentsummary",
    ("PUT", "CREATE"): "nn_create", ("POST", "APPEND"): "nn_append", ("PUT", "MKDIRS"): "nn_mkdirs",
    ("PUT", "RENAME"): "nn_rename", ("PUT", "SETPERMISSION"): "nn_setpermission", ("PUT", "SETOWNER"): "nn_setowner",
    ("DELETE", "DELETE"): "nn_delete",
}
_DATANODE_OPS = {("PUT", "CREATE"): "dn_create", ("POST", "APPEND"): "dn_append", ("GET", "OPEN"): "dn_open"}


def _permission(query: dict[str, str], default: int) -> int:
    raw = query.get("permission")
    if raw in (None, ""):
        return default
    try:
        value = int(raw, 8)
    except ValueError:
        raise RemoteException("IllegalArgumentException", f"Invalid value for webhdfs parameter \"permission\": {raw}") from None
    if not 0 <= value <= 0o1777:
        raise RemoteException("IllegalArgumentException", f"Invalid value for webhdfs parameter \"permission\": {raw}")
    return value


def _boolean(query: dict[str, str], name: str) -> bool:
    raw = query.get(name, "false").lower()
    if raw not in ("true", "false"):
        raise RemoteException("IllegalArgumentException", f"Invalid value for webhdfs parameter \"{name}\": {raw}")
    return raw == "true"

