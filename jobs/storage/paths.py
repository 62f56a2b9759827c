"""How users address storage: from what they type to one storage path.

Every place the portal touches storage works with a *storage path*: an
absolute POSIX path in the storage's own namespace ("/alice/code"), never a
host path. Users may write any of these (the README has the table):

- a URI of the configured backend (its kind in registry.py says how they read):
    local   file:///alice/code, file:/alice/code (what "$PAI_DEFAULT_FS_URI/alice/code"
            gives with the default "file://"), file://localhost/alice/code
    webhdfs hdfs://namenode:9000/alice/code (same authority as PAI_DEFAULT_FS_URI),
            hdfs:///alice/code, hdfs:/alice/code
- an absolute path, "/alice/code": the same place in the storage namespace;
- a relative path, "code": relative to the user's home "/<user>".

On local storage "/alice/code" is STORAGE_LOCAL_ROOT/alice/code: a path can
never name a host file outside that root. `..` is refused outright rather
than collapsed, so nobody can be surprised by where a path lands. URIs are
taken literally (no %-decoding): OpenPAI configs write raw paths. A path has
at most MAX_DEPTH parts, whichever backend it is for.
"""

from __future__ import annotations

import posixpath
import re

from jobs.jsonc import SURROGATE_RE
from jobs.storage.errors import StorageError
from jobs.storage.registry import StorageKind, storage_for_backend

ROOT = "/"
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# HdfsCLI's client expands a path part ending in "#LATEST" (or "#LATEST{n}")
# to the newest entry of its folder, on every call but a rename's target:
# such a name could be written but not read, and deleting it deleted another.
_LATEST_RE = re.compile(r"#LATEST(?:\{\d+\})?$")
# Parts (folders and the name at the end) a storage path may have. Far more
# than anyone nests folders, and far below what breaks: Path.mkdir(parents=True)
# recurses once per missing folder (Python stops at 1,000 frames), the
# backends' tree walks recurse per level, and HDFS refuses paths deeper than 1,000.
MAX_DEPTH = 100
# Bytes (UTF-8) a name may have: HDFS's default limit
# (dfs.namenode.fs-limits.max-component-length) and most file systems'. HDFS
# finds a longer one only as it is written, after an upload's other files.
MAX_NAME_BYTES = 255
# How much of a refused path a message quotes.
_SHOWN_CHARS = 80


def normalize(path: str, *, typed: str | None = None) -> str:
    """"/a//b/./c/" -> "/a/b/c". Refuses `..`, control characters, lone
    surrogates, names over MAX_NAME_BYTES and more than MAX_DEPTH parts;
    messages quote `typed`, what the user wrote, when given."""
    if _CONTROL_RE.search(path):
        raise StorageError(f'"{typed or path}" contains control characters')
    # Lone surrogates (a form's RFC 2231 file name can decode to them) are no
    # text: no file system can store them, and encoding one for the disk fails.
    if SURROGATE_RE.search(path):
        raise StorageError(f'"{_shown(typed or path)}" holds characters that are not text (lone UTF-16 surrogates, '
                           "shown as \ufffd); expected Unicode text")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise StorageError(f'"{typed or path}" contains "..": write the path without going up a folder')
    if any(_LATEST_RE.search(part) for part in parts):
        raise StorageError(f'"{_shown(typed or path)}" has a name ending in #LATEST, which HDFS clients read as '
                           "the newest entry of its folder; rename it")
    # A part of at most MAX_NAME_BYTES // 4 characters cannot pass it: encoded only past that.
    if any(len(part) > MAX_NAME_BYTES // 4 and len(part.encode()) > MAX_NAME_BYTES for part in parts):
        raise StorageError(f'"{_shown(typed or path)}" has a name longer than {MAX_NAME_BYTES} bytes (in UTF-8), '
                           "more than storage takes; shorten it")
    if len(parts) > MAX_DEPTH:
        raise StorageError(f'"{_shown(typed or path)}" has {len(parts)} parts; a storage path may have at most '
                           f"{MAX_DEPTH} (its folders and the name at its end)")
    return "/" + "/".join(parts)


def _shown(text: str) -> str:
    """`text` as a message quotes it: the start of a long one, with lone
    surrogates replaced (a page holding one could not be sent as UTF-8)."""
    text = SURROGATE_RE.sub("\ufffd", text)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def join(folder: str, *names: str) -> str:
    return normalize(posixpath.join(folder, *names))


def parent(path: str) -> str:
    return posixpath.dirname(path) or ROOT


def _uri_path(value: str, *, kind: StorageKind, default_fs_uri: str) -> str:
    scheme = _SCHEME_RE.match(value).group(1).lower()
    root = kind.root(default_fs_uri)
    if scheme != kind.scheme:
        raise StorageError(f'"{value}": this portal keeps files {kind.where}; expected {root}/<path> '
                           "(or a path such as /<you>/code)")
    rest = value[len(scheme) + 1:]
    if rest.startswith("//"):
        authority, _, path = rest[2:].partition("/")
        path = "/" + path
        if authority.lower() not in kind.hosts(default_fs_uri):
            if kind.names_host:
                raise StorageError(f'"{value}": that is not this cluster\'s {kind.label}; expected {root}/<path>')
            raise StorageError(f'"{value}": a {scheme}:// URI names no host; write {root}/{authority}{path.rstrip("/")}')
        return path
    if not rest.startswith("/"):
        raise StorageError(f'"{value}": expected an absolute path after "{scheme}:", e.g. {scheme}:///<you>/code')
    return rest


def to_path(value: str, *, backend: str, default_fs_uri: str, user_name: str | None) -> str:
    """The storage path a user means by `value` (see the module docstring)."""
    value = value.strip()
    if not value:
        raise StorageError("the path is empty")
    if _SCHEME_RE.match(value) and not value.startswith("/"):
        path = _uri_path(value, kind=storage_for_backend(backend), default_fs_uri=default_fs_uri)
    elif value.startswith("/"):
        path = value
    else:
        if not user_name:
            raise StorageError(f'"{value}" is relative; expected an absolute path such as /<user>/{value}')
        path = f"/{user_name}/{value}"
    return normalize(path, typed=value)


def to_uri(path: str, *, backend: str, default_fs_uri: str) -> str:
    """The URI users put in a job config for a storage path."""
    return storage_for_backend(backend).root(default_fs_uri) + path
