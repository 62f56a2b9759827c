"""Storage: addressing and access rules, the registry of kinds of storage
(and start-up checks of their settings), the local-disk backend, submission
checks, and the storage page through Django's test client. The end-to-end
run (browser upload, a job using the code, its output) is in
test_storage_browser.py.

The WebHDFS backend is tested against a real HDFS in test_webhdfs.py and
test_webhdfs_jobs.py. The protocol server tests/webhdfs_server.py stays
here for what a real HDFS cannot show on demand: which requests the portal
sends, to which server, as whom (and quota tests that count them)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from jobs import services, storage
from jobs.services.storage_links import job_storage_links
from jobs.spec import SpecError
from jobs.storage import access, paths, registry
from jobs.storage.local import LocalBackend
from tests.helpers import config, role
from tests.webhdfs_server import WebHdfsServer

MB = 1024 * 1024
HDFS_URI = "hdfs://namenode:9000"


@pytest.fixture
def local(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "root")


@pytest.fixture(scope="module")
def hdfs_server():
    """The protocol server, set up as the README asks of a cluster: the
    portal's service user (its superuser "hdfs" here) may act for others,
    and /tmp is open to everyone."""
    server = WebHdfsServer(proxy_users=frozenset({"hdfs"})).start()
    base = f"{server.url}/webhdfs/v1"
    requests.put(f"{base}/tmp?op=MKDIRS&permission=1777&user.name=hdfs", timeout=5).raise_for_status()
    yield server
    server.stop()


@pytest.fixture
def on_hdfs(hdfs_server):
    """The whole storage package on the protocol server, as STORAGE_BACKEND=webhdfs sets it."""
    with override_settings(STORAGE_BACKEND="webhdfs", WEBHDFS_URL=hdfs_server.url, WEBHDFS_USER="hdfs",
                           PAI_DEFAULT_FS_URI=HDFS_URI):
        yield hdfs_server


def reader(name: str = "alice", *, admin: bool = False) -> access.Reader:
    return access.Reader(name=name, is_admin=admin, shared=("shared",))


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


# ------------------------------------------------------------------ addressing

@pytest.mark.parametrize("value, expected", [
    ("file:///alice/code", "/alice/code"),
    ("file:/Output/alice/hello", "/Output/alice/hello"),  # "$PAI_DEFAULT_FS_URI/Output/..." with "file://"
    ("file://localhost/alice/code/", "/alice/code"),
    ("/alice//code/./src", "/alice/code/src"),
    ("code/train", "/alice/code/train"),
    ("file://", "/"),
])
def test_it_addresses_local_storage_with_file_uris_and_home_relative_paths(value: str, expected: str) -> None:
    assert paths.to_path(value, backend="local", default_fs_uri="file:", user_name="alice") == expected


def test_it_turns_any_accepted_form_into_one_uri_for_the_node(alice, tmp_path: Path) -> None:
    home = f"/{alice.username}"
    storage.backend().write(f"{home}/code/run.sh", io.BytesIO(b"echo hi\n"))
    assert storage.canonical_uri("code", user_name=alice.username) == f"file://{home}/code"
    assert storage.canonical_uri(f"file:{home}/code", user_name=alice.username) == f"file://{home}/code"
    assert storage.canonical_uri("hdfs://x/y", user_name=alice.username) == "hdfs://x/y"  # left for submission to report
    with pytest.raises(storage.StorageError, match="is relative; expected an absolute path"):
        storage.stage_tree("code", tmp_path / "a", max_bytes=MB)
    assert storage.stage_tree("code", tmp_path / "b", max_bytes=MB, user_name=alice.username) == 8


@pytest.mark.parametrize("value, expected", [
    (f"{HDFS_URI}/alice/code", "/alice/code"),
    ("hdfs:///alice/code", "/alice/code"),
    ("hdfs:/Output/alice/job", "/Output/alice/job"),
    ("data", "/alice/data"),
])
def test_it_addresses_hdfs_with_the_default_fs_authority(value: str, expected: str) -> None:
    assert paths.to_path(value, backend="webhdfs", default_fs_uri=HDFS_URI, user_name="alice") == expected


@pytest.mark.parametrize("backend, value, words", [
    ("local", "/alice/../bob/code", '".."'),
    ("local", "../bob", '".."'),
    ("local", "hdfs://namenode:9000/alice", "expected file:///"),
    ("local", "file://alice/code", "write file:///alice/code"),
    ("local", "s3://bucket/x", "expected file:///"),
    ("local", "file:relative", "expected an absolute path"),
    ("webhdfs", "hdfs://elsewhere:9000/alice", "not this cluster's HDFS"),
    ("webhdfs", "file:///alice/code", f"expected {HDFS_URI}/<path>"),
    ("local", "/alice/a\x00b", "control characters"),
])
def test_it_refuses_addresses_that_escape_or_name_another_storage(backend: str, value: str, words: str) -> None:
    with pytest.raises(storage.StorageError) as error:
        paths.to_path(value, backend=backend, default_fs_uri=HDFS_URI if backend == "webhdfs" else "file:", user_name="alice")
    assert words in str(error.value)


def test_it_gives_each_user_their_home_their_outputs_and_read_only_shared_folders() -> None:
    alice, admin = reader("alice"), reader("root", admin=True)
    assert access.may_write(alice, "/alice/code") and access.may_write(alice, "/Output/alice/job")
    assert not access.may_read(alice, "/bob/code") and not access.may_read(alice, "/Output/bob/job")
    assert access.may_read(alice, "/shared/imagenet") and not access.may_write(alice, "/shared/imagenet")
    assert access.may_read(alice, "/") and access.may_read(alice, "/Output") and not access.may_write(alice, "/Output")
    assert not access.may_delete(alice, "/alice") and not access.may_delete(alice, "/Output/alice")
    assert access.may_delete(alice, "/alice/code") and access.may_delete(alice, "/Output/alice/job")
    assert access.may_write(admin, "/bob/code") and access.may_delete(admin, "/shared/x")
    # A user named like the Output tree or a shared folder gains nothing over it.
    assert not access.may_write(reader("Output"), "/Output/bob") and access.may_write(reader("Output"), "/Output/Output/x")
    assert not access.may_write(reader("shared"), "/shared/x")
    with pytest.raises(storage.StorageAccessDenied, match="/alice and /Output/alice"):
        access.check_write(alice, "/bob/x")


# ---------------------------------------------------------------- registry

def test_it_finds_each_storage_backend_by_its_name_and_its_uri_scheme() -> None:
    found = {name: registry.storage_for_backend(name) for name in registry.BACKEND_NAMES}
    assert {name: kind.scheme for name, kind in found.items()} == {"local": "file", "webhdfs": "hdfs"}
    assert all(registry.storage_for_scheme(kind.scheme) is kind for kind in found.values())
    assert registry.storage_for_scheme("HDFS") is found["webhdfs"] and registry.storage_for_scheme("s3") is None
    with pytest.raises(ImproperlyConfigured, match="STORAGE_BACKEND='s3': expected one of local, webhdfs"):
        registry.storage_for_backend("s3")
    with pytest.raises(ValueError, match="hdfs:// is already STORAGE_BACKEND=webhdfs"):
        registry.register_storage(dataclasses.replace(found["webhdfs"], backend="hdfs2"))


@pytest.fixture
def memory_kind(tmp_path: Path):
    """A third kind of storage registered the way a backend module does it:
    "mem://bucket/<path>" URIs name their bucket, kept on local disk here."""
    kind = registry.register_storage(registry.StorageKind(
        scheme="mem", backend="memory", label="bucket", where="in a bucket", names_host=True,
        default_fs_uri="mem://bucket", fs_uri_hint="mem://<bucket>", settings=("STORAGE_LOCAL_ROOT",),
        make=lambda values: LocalBackend(Path(values["STORAGE_LOCAL_ROOT"]) / "mem"),
    ))
    yield kind
    del registry._kinds[kind.scheme]


def test_it_addresses_and_makes_a_newly_registered_kind_of_storage(memory_kind, tmp_path: Path) -> None:
    def to_path(value: str) -> str:
        return paths.to_path(value, backend="memory", default_fs_uri="mem://bucket", user_name="alice")

    assert to_path("mem://bucket/alice/code") == to_path("mem:///alice/code") == to_path("code") == "/alice/code"
    assert paths.to_uri("/alice/code", backend="memory", default_fs_uri="mem://bucket") == "mem://bucket/alice/code"
    with pytest.raises(storage.StorageError, match="not this cluster's bucket; expected mem://bucket/<path>"):
        to_path("mem://other/alice")
    with pytest.raises(storage.StorageError, match="keeps files in a bucket; expected mem://bucket/<path>"):
        to_path("file:///alice")
    with override_settings(STORAGE_BACKEND="memory", PAI_DEFAULT_FS_URI="mem://bucket", STORAGE_LOCAL_ROOT=tmp_path):
        storage.backend().write("/alice/x.txt", io.BytesIO(b"x"))
        assert (tmp_path / "mem/alice/x.txt").read_bytes() == b"x"
        assert storage.canonical_uri("x.txt", user_name="alice") == "mem://bucket/alice/x.txt"


@pytest.mark.parametrize("environ, message", [
    ({"STORAGE_BACKEND": "s3"}, "STORAGE_BACKEND='s3': expected one of local, webhdfs"),
    ({"STORAGE_BACKEND": "webhdfs", "WEBHDFS_URL": ""}, "STORAGE_BACKEND=webhdfs needs WEBHDFS_URL"),
    ({"STORAGE_BACKEND": "webhdfs", "WEBHDFS_URL": "http://nn:9870", "PAI_DEFAULT_FS_URI": "file://"},
     "PAI_DEFAULT_FS_URI='file:' does not match STORAGE_BACKEND=webhdfs: expected hdfs://<namenode>:<rpc port>"),
    ({"STORAGE_BACKEND": "local", "PAI_DEFAULT_FS_URI": "hdfs://nn:9000"},
     "PAI_DEFAULT_FS_URI='hdfs://nn:9000' does not match STORAGE_BACKEND=local: expected file:// (or leave it empty)"),
])
def test_it_fails_at_start_up_on_storage_settings_the_backend_cannot_use(tmp_path, environ, message) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PORTAL_", "DJANGO_", "PAI_DEFAULT", "WEBHDFS"))}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=Path(__file__).resolve().parent.parent,
                            env={**base, "PORTAL_VAR_DIR": str(tmp_path), "PORTAL_SECRET_KEY": "k" * 50, **environ},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]


# ------------------------------------------------------------ local backend

def test_it_writes_lists_reads_and_deletes_on_local_disk(local: LocalBackend) -> None:
    assert local.write("/alice/code/train.py", io.BytesIO(b"print(1)\n")) == 9
    local.mkdir("/alice/empty")
    listing = {e.name: e for e in local.list("/alice")}
    assert listing["code"].is_dir and listing["empty"].is_dir and listing["code"].modified is not None
    assert local.stat("/alice/code/train.py").size == 9
    assert b"".join(local.iter_bytes("/alice/code/train.py")) == b"print(1)\n"
    with pytest.raises(storage.StorageError, match="already exists"):
        local.write("/alice/code/train.py", io.BytesIO(b"x"))
    assert local.write("/alice/code/train.py", io.BytesIO(b"v2"), overwrite=True) == 2
    with pytest.raises(storage.StorageError, match="is a folder"):
        local.write("/alice/code", io.BytesIO(b"x"), overwrite=True)
    with pytest.raises(storage.StorageNotFound):
        local.list("/alice/missing")
    assert local.delete("/alice/code", recursive=True) and local.stat("/alice/code") is None
    assert local.delete("/alice/code") is False
    assert not [p for p in local.root.rglob("*") if p.name.startswith(".pai-upload-")]


def test_it_never_follows_symlinks_out_of_the_local_root(local: LocalBackend, tmp_path: Path) -> None:
    secret = write_tree(tmp_path / "host", {"secret.txt": b"host file"})
    local.mkdir("/alice")
    os.symlink(secret, local.root / "alice" / "escape")
    os.symlink(secret / "secret.txt", local.root / "alice" / "link.txt")
    assert [e.name for e in local.list("/alice")] == []  # symlinks are not shown
    with pytest.raises(storage.StorageAccessDenied, match="outside the storage folder"):
        local.list("/alice/escape")
    with pytest.raises(storage.StorageAccessDenied):
        b"".join(local.iter_bytes("/alice/link.txt"))
    with pytest.raises(storage.StorageAccessDenied):
        local.write("/alice/escape/new.txt", io.BytesIO(b"x"))
    assert sorted(p.name for p in secret.iterdir()) == ["secret.txt"]


def test_it_resolves_paths_as_realpath_does_looking_only_below_the_root(local: LocalBackend, tmp_path: Path) -> None:
    """_real walks the parts below the (resolved) root itself: for every
    shape of path it must land where os.path.realpath lands, and refuse
    whatever realpath would place outside the root."""
    root = local.root
    write_tree(root / "alice", {"code/train.py": b"x", "data/set.csv": b"y"})
    os.symlink(root / "alice" / "code", root / "alice" / "code-link")  # inside, absolute
    os.symlink("data", root / "alice" / "data-link")  # inside, relative
    os.symlink("code-link", root / "alice" / "chain")  # a link to a link
    os.symlink(tmp_path, root / "alice" / "out")  # outside
    os.symlink("../..", root / "alice" / "up")  # outside, relative
    os.symlink("loop", root / "alice" / "loop")  # itself
    inside = ["/", "/alice", "/alice/code/train.py", "/alice/missing/deeper", "/alice/code/train.py/below",
              "/alice/code-link/train.py", "/alice/data-link/set.csv", "/alice/chain/new.txt", "/alice/loop"]
    for path in inside:
        expected = os.path.realpath(os.path.join(root, *[p for p in path.split("/") if p]))
        assert str(local._real(path)) == expected, path
    for path in ["/alice/out", "/alice/out/x", "/alice/up", "/alice/up/etc"]:
        with pytest.raises(storage.StorageAccessDenied, match="outside the storage folder"):
            local._real(path)


def test_it_stages_a_tree_within_the_size_limit_and_refuses_beyond(local: LocalBackend, tmp_path: Path) -> None:
    source = write_tree(tmp_path / "src", {"train.py": b"a" * 1000, "lib/util.py": b"b" * 1000})
    (source / "empty").mkdir()
    os.symlink("/etc/passwd", source / "passwd")
    assert local.upload_tree(source, "/alice/code") == 2000
    assert local.stat("/alice/code/passwd") is None  # uploads skip symlinks
    copied = local.download_tree("/alice/code", tmp_path / "stage", max_bytes=2000)
    assert copied == 2000 and (tmp_path / "stage/lib/util.py").read_bytes() == b"b" * 1000
    assert (tmp_path / "stage/empty").is_dir()
    with pytest.raises(storage.StorageError, match="more than 0.00143051 MB"):
        local.download_tree("/alice/code", tmp_path / "stage2", max_bytes=1500)
    with pytest.raises(storage.StorageError, match="is a file; expected a folder"):
        local.download_tree("/alice/code/train.py", tmp_path / "stage3", max_bytes=MB)


def test_it_parses_an_auth_file_without_ever_quoting_it() -> None:
    assert storage.parse_auth_file(b"registry.example.com:5000\nalice\ns3cr3t-pw\n\n") == (
        "registry.example.com:5000", "alice", "s3cr3t-pw")
    assert storage.parse_auth_file(b"r\r\nu\r\np\r\n") == ("r", "u", "p")
    for bad in (b"registry\nalice\n", b"r\nu\n\np-secret", b"r\nu\np-secret\nextra", b"\xff\xfe"):
        with pytest.raises(storage.StorageError) as error:
            storage.parse_auth_file(bad)
        assert "secret" not in str(error.value)


# ---------------------------------------------------------------- submission

def test_it_refuses_job_paths_outside_the_users_folders_naming_the_field(alice, bob) -> None:
    cfg = config("paths", role(), codeDir=f"file:///{bob.username}/code", dataDir="/etc",
                 outputDir=f"file:///Output/{bob.username}/x", authFile="../auth")
    with pytest.raises(SpecError) as error:
        services.job_submit(owner=alice, config=json.dumps(cfg))
    problems = {p.path: p.message for p in error.value.problems}
    assert set(problems) == {"codeDir", "dataDir", "outputDir", "authFile"}
    assert f"you may not read /{bob.username}/code" in problems["codeDir"]
    assert f"/{alice.username} and /Output/{alice.username}" in problems["codeDir"]
    assert "you may not read /etc" in problems["dataDir"]
    assert problems["authFile"] == '"../auth" contains "..": write the path without going up a folder'


def test_it_checks_the_output_dir_at_submission_and_makes_it_only_when_asked(alice) -> None:
    job = services.job_submit(owner=alice, config=json.dumps(config("outdefault", role())))
    # Stored as a full URI; `$PAI_DEFAULT_FS_URI/Output/...` itself reads file:/Output/...
    assert job.config["outputDir"] == f"file:///Output/{alice.username}/outdefault"
    services.job_stop(job=job, by=alice)
    assert storage.backend().stat(f"/Output/{alice.username}/outdefault") is None  # the node makes it
    storage.ensure_output_dir(uri=job.config["outputDir"], reader=storage.reader_for(user_name=alice.username,
                                                                                     is_admin=False))
    assert storage.backend().stat(f"/Output/{alice.username}/outdefault").is_dir


def test_it_refuses_an_output_dir_with_a_file_in_its_place_or_above_it(alice) -> None:
    out = f"/Output/{alice.username}"
    storage.backend().write(f"{out}/taken", io.BytesIO(b"a file"))
    refused = {"outputDir": f"file://{out}/taken/sub",
               "taken": f"file://{out}/taken", "deeper": f"file://{out}/taken/a/b"}
    for name, uri in refused.items():
        with pytest.raises(SpecError) as error:
            services.job_submit(owner=alice, config=json.dumps(config(f"out{name}", role(), outputDir=uri)))
        [problem] = error.value.problems
        assert problem.path == "outputDir"
        if uri.endswith("/taken"):
            assert problem.message == f"file://{out}/taken is a file; expected a folder"
        else:
            assert problem.message == f"file://{out}/taken is a file; expected a folder, since outputDir goes inside it"
    assert storage.backend().stat(f"{out}/taken").size == 6  # nothing was changed
    assert not alice.jobs.exists()


def test_it_checks_code_dir_and_auth_file_exist_at_submission(alice) -> None:
    home = f"/{alice.username}"
    storage.backend().write(f"{home}/auth.txt", io.BytesIO(b"registry.local\nalice\nhunter2-pw\n"))
    storage.backend().write(f"{home}/bad-auth.txt", io.BytesIO(b"registry.local\nhunter2-pw\n"))
    cfg = config("codecheck", role(), codeDir="missing-code", authFile="bad-auth.txt")
    with pytest.raises(SpecError) as error:
        services.job_submit(owner=alice, config=json.dumps(cfg))
    problems = {p.path: p.message for p in error.value.problems}
    assert problems["codeDir"] == f"file://{home}/missing-code does not exist; expected an existing folder"
    assert "three were expected" in problems["authFile"] and "hunter2" not in problems["authFile"]
    storage.backend().mkdir(f"{home}/code")
    job = services.job_submit(owner=alice, config=json.dumps({**cfg, "authFile": f"file://{home}/auth.txt",
                                                              "codeDir": "code"}))
    assert storage.read_small_file(job.config["authFile"], max_bytes=100).endswith(b"hunter2-pw\n")
    services.job_stop(job=job, by=alice)


def test_the_node_checks_the_owners_access_again_when_it_reads_or_writes_for_a_job(alice, bob, tmp_path) -> None:
    # An admin's job may name any user's folders; should its owner lose the
    # admin right before a task starts, the node refuses what they may no
    # longer touch (the node acts as the owner as they are at launch).
    theirs = f"/{bob.username}"
    storage.backend().mkdir(f"{theirs}/code")
    storage.backend().write(f"{theirs}/code/run.sh", io.BytesIO(b"echo hi"))
    storage.backend().write(f"{theirs}/auth.txt", io.BytesIO(b"registry.local\nbob\nhunter2-pw\n"))
    admin = storage.reader_for(user_name=alice.username, is_admin=True)
    was_admin = storage.reader_for(user_name=alice.username, is_admin=False)
    code, auth, out = f"file://{theirs}/code", f"file://{theirs}/auth.txt", f"file://{theirs}/out"
    assert storage.stage_tree(code, tmp_path / "a", max_bytes=MB, reader=admin) == 7
    refused = {
        "codeDir": lambda: storage.stage_tree(code, tmp_path / "b", max_bytes=MB, reader=was_admin),
        "dataDir": lambda: storage.stage_data(code, tmp_path / "c", max_bytes=MB, reader=was_admin),
        "authFile": lambda: storage.read_small_file(auth, max_bytes=100, reader=was_admin),
        "outputDir": lambda: storage.ensure_output_dir(uri=out, reader=was_admin),
    }
    for field, act in refused.items():
        with pytest.raises(storage.StorageAccessDenied, match=f"you may (not read|not write to) {theirs}/"):
            act()
    source = write_tree(tmp_path / "output", {"result.txt": b"42"})
    with pytest.raises(storage.StorageAccessDenied, match=f"you may not write to {theirs}/out"):
        storage.upload_tree(source, out, reader=was_admin)
    assert storage.backend().stat(f"{theirs}/out") is None
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


# ------------------------------------------------------------------- WebHDFS

def test_it_speaks_webhdfs_as_apache_documents_it(hdfs_server) -> None:
    base = f"{hdfs_server.url}/webhdfs/v1"
    create = requests.put(f"{base}/tmp/hello.txt?op=CREATE&user.name=carol", allow_redirects=False, timeout=5)
    assert create.status_code == 307 and hdfs_server.datanode_address in create.headers["Location"]
    written = requests.put(create.headers["Location"], data=b"hello", timeout=5)
    assert written.status_code == 201 and written.headers["Location"].startswith("webhdfs://")
    status = requests.get(f"{base}/tmp/hello.txt?op=GETFILESTATUS", timeout=5).json()["FileStatus"]
    assert (status["type"], status["length"], status["owner"], status["permission"]) == ("FILE", 5, "carol", "644")
    opened = requests.get(f"{base}/tmp/hello.txt?op=OPEN&offset=1&length=3", allow_redirects=False, timeout=5)
    assert opened.status_code == 307
    assert requests.get(opened.headers["Location"], timeout=5).content == b"ell"
    listing = requests.get(f"{base}/tmp/hello.txt?op=LISTSTATUS", timeout=5).json()["FileStatuses"]["FileStatus"]
    assert [s["pathSuffix"] for s in listing] == [""]  # a file lists itself
    missing = requests.get(f"{base}/nope?op=GETFILESTATUS", timeout=5)
    assert missing.status_code == 404
    assert missing.json()["RemoteException"] == {"exception": "FileNotFoundException",
                                                 "javaClassName": "java.io.FileNotFoundException",
                                                 "message": "File does not exist: /nope"}
    denied = requests.put(f"{base}/not-yours?op=MKDIRS", timeout=5)  # no user.name: the static web user
    assert denied.status_code == 403 and "user=dr.who" in denied.json()["RemoteException"]["message"]
    assert requests.get(f"{base}/x?op=BOGUS", timeout=5).status_code == 400
    assert requests.delete(f"{base}/tmp/hello.txt?op=DELETE&user.name=hdfs", timeout=5).json() == {"boolean": True}


def test_it_sends_each_users_requests_as_that_user_namenode_first_then_the_datanode(client, alice, on_hdfs) -> None:
    """What only the protocol server shows: the requests themselves."""
    on_hdfs.requests.clear()
    client.force_login(alice)
    home = f"/{alice.username}"
    client.get("/storage/")  # makes the home: the service user, then SETOWNER
    upload = io.BufferedReader(io.BytesIO(b"x" * (2 * MB)))
    storage.backend_for(storage.reader_for(user_name=alice.username, is_admin=False)).write(f"{home}/big.bin", upload)
    assert b"".join(client.get("/storage/download/", {"path": f"{home}/big.bin"}).streaming_content) == b"x" * (2 * MB)
    seen = [(r.server, r.op, r.user) for r in on_hdfs.requests]
    assert ("namenode", "MKDIRS", "hdfs") in seen and ("namenode", "SETOWNER", "hdfs") in seen
    data = [(server, op) for server, op, user in seen if user == alice.username]
    for op in ("CREATE", "OPEN"):  # the namenode redirects, the datanode takes the bytes; both as alice
        assert data.index(("namenode", op)) < data.index(("datanode", op))
    assert {user for _, op, user in seen if op in ("CREATE", "OPEN", "LISTSTATUS")} == {alice.username}
    assert on_hdfs.fs.inode(f"{home}/big.bin").owner == alice.username


# ------------------------------------------------------------- storage page

class _UnreadableAfter:
    """A local file whose reading fails after its first piece (a disk error
    on the node, an upload's temporary file gone)."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise OSError(5, "Input/output error")
        return b"n" * 1000


def test_a_local_read_error_while_writing_to_hdfs_is_told_apart_from_hdfs_not_answering(hdfs_server,
                                                                                       tmp_path) -> None:
    """A local file that cannot be read came out of the WebHDFS backend as a
    bare OSError, which the node's output upload worded as if HDFS had
    failed ("could not upload /pai/output to hdfs://...: Input/output
    error"), and the local backend as "the storage folder refuses access".
    It is no outage (StorageUnavailable, retried): the storage answered."""
    from jobs.storage.webhdfs import WebHdfsBackend

    hdfs = WebHdfsBackend(hdfs_server.url, user="hdfs")
    hdfs.mkdir("/tmp/read-errors")
    with pytest.raises(storage.StorageSourceUnreadable) as local:
        hdfs.write("/tmp/read-errors/model.bin", _UnreadableAfter())
    assert not isinstance(local.value, storage.StorageUnavailable)
    assert str(local.value) == ("could not read what was being written to /tmp/read-errors/model.bin: "
                                "Input/output error (a local read, not the storage)")
    assert [e.name for e in hdfs.list("/tmp/read-errors")] == []  # nothing half-written left

    def pieces():
        yield b"x" * 1000
        raise OSError(5, "Input/output error")
    with pytest.raises(storage.StorageSourceUnreadable):
        hdfs.write_new("/tmp/read-errors/upload.bin", pieces())
    assert hdfs.stat("/tmp/read-errors/upload.bin") is None

    down = WebHdfsBackend("http://127.0.0.1:9", user="hdfs")
    with pytest.raises(storage.StorageUnavailable, match="did not answer"):
        down.write("/tmp/read-errors/model.bin", io.BytesIO(b"fine"))

    local = LocalBackend(tmp_path / "root")
    with pytest.raises(storage.StorageSourceUnreadable, match="a local read, not the storage"):
        local.write("/alice/model.bin", _UnreadableAfter())
    assert local.stat("/alice/model.bin") is None


def test_it_browses_uploads_downloads_and_deletes_on_the_storage_page(client, alice) -> None:
    client.force_login(alice)
    home = f"/{alice.username}"
    page = client.get("/storage/")
    assert page.status_code == 200 and f"file://{home}" in page.content.decode()
    folder_upload = [io.BytesIO(b"print('hi')\n"), io.BytesIO(b"x = 1\n")]
    for item, name in zip(folder_upload, ("train.py", "util.py")):
        item.name = name
    saved = client.post("/storage/upload/", {"path": home, "files": folder_upload, "names": ["proj/train.py", "proj/lib/util.py"]},
                        headers={"accept": "application/json"})
    assert saved.status_code == 200 and saved.json()["saved"] == [f"{home}/proj/train.py", f"{home}/proj/lib/util.py"]
    again = io.BytesIO(b"new")
    again.name = "train.py"
    conflict = client.post("/storage/upload/", {"path": f"{home}/proj", "files": [again]}, headers={"accept": "application/json"})
    assert conflict.status_code == 409 and "replace existing files" in conflict.json()["error"]
    listing = client.get("/storage/", {"path": f"{home}/proj"}).content.decode().replace("\xa0", " ")
    assert "train.py" in listing and "lib/" in listing and "12 bytes" in listing
    assert f"/submit/?codeDir=file%3A%2F%2F%2F{alice.username}%2Fproj" in listing
    download = client.get("/storage/download/", {"path": f"{home}/proj/train.py"})
    assert b"".join(download.streaming_content) == b"print('hi')\n"
    assert download["Content-Disposition"] == "attachment; filename*=UTF-8''train.py"
    assert client.post("/storage/folder/", {"path": home, "name": "results"}).status_code == 302
    assert storage.backend().stat(f"{home}/results").is_dir
    confirm = client.get("/storage/delete/", {"path": f"{home}/proj"})
    assert "everything in it" in confirm.content.decode() and storage.backend().stat(f"{home}/proj") is not None
    assert client.post("/storage/delete/", {"path": f"{home}/proj"}).status_code == 302
    assert storage.backend().stat(f"{home}/proj") is None


def test_it_keeps_other_users_files_out_of_reach_on_the_storage_page(client, alice, bob) -> None:
    storage.backend().write(f"/{bob.username}/private.txt", io.BytesIO(b"bob's"))
    client.force_login(alice)
    assert client.get("/storage/", {"path": f"/{bob.username}"}).status_code == 403
    assert client.get("/storage/download/", {"path": f"/{bob.username}/private.txt"}).status_code == 403
    assert client.get("/storage/download/", {"path": f"/{alice.username}/../{bob.username}/private.txt"}).status_code == 400
    assert client.post("/storage/delete/", {"path": f"/{bob.username}/private.txt"}).status_code == 302
    assert storage.backend().stat(f"/{bob.username}/private.txt") is not None
    stolen = io.BytesIO(b"x")
    stolen.name = "x.txt"
    refused = client.post("/storage/upload/", {"path": f"/{bob.username}", "files": [stolen]}, headers={"accept": "application/json"})
    assert refused.status_code == 403 and "you may not write" in refused.json()["error"]
    assert client.get("/storage/").status_code == 200  # the first visit makes the home folder
    storage.backend().mkdir(f"/Output/{alice.username}")
    root = client.get("/storage/", {"path": "/"}).content.decode()
    assert f"?path=/{bob.username}" not in root and f"?path=/{alice.username}" in root and "Output/" in root
    assert client.get("/storage/delete/", {"path": f"/{alice.username}"}).status_code == 403


def test_it_links_a_jobs_folders_to_the_storage_page(client, alice, bob, admin_user) -> None:
    storage.backend().mkdir(f"/{alice.username}/code")
    job = services.job_submit(owner=alice, config=json.dumps(config("links", role(), codeDir="code", dataDir="/shared/data")))
    services.job_stop(job=job, by=alice)
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/storage/?path=%2F{alice.username}%2Fcode"' in html
    assert f'href="/storage/?path=%2FOutput%2F{alice.username}%2Flinks"' in html
    assert 'href="/storage/?path=%2Fshared%2Fdata"' in html
    as_bob = {link.field: link.url for link in job_storage_links(job=job, user=bob)}  # he cannot see the page
    assert as_bob["dataDir"] == "/storage/?path=%2Fshared%2Fdata" and as_bob["codeDir"] == ""
    client.force_login(admin_user)
    assert f'href="/storage/?path=%2F{alice.username}%2Fcode"' in client.get(f"/jobs/{job.pk}/").content.decode()
