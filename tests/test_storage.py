"""Storage: addressing and access rules, the local-disk backend, the WebHDFS
backend against tests/webhdfs_server.py, submission checks, and the storage
page through Django's test client. The end-to-end run (browser upload, a job
using the code, its output) is in test_storage_browser.py."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import requests
from django.test import override_settings

from jobs import services, storage
from jobs.spec import SpecError
from jobs.storage import access, paths
from jobs.storage.local import LocalBackend
from jobs.storage.webhdfs import WebHdfsBackend
from tests.helpers import config, role
from tests.webhdfs_server import WebHdfsServer

MB = 1024 * 1024
HDFS_URI = "hdfs://namenode:9000"


@pytest.fixture
def local(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path / "root")


@pytest.fixture(scope="module")
def hdfs_server():
    """A cluster as an admin would prepare it for the portal: the service user
    "pai" owns the root (homes, /Output and shared folders live there) and
    /tmp is open to everyone."""
    server = WebHdfsServer().start()
    base = f"{server.url}/webhdfs/v1"
    requests.put(f"{base}/?op=SETOWNER&owner=pai&user.name=hdfs", timeout=5).raise_for_status()
    requests.put(f"{base}/tmp?op=MKDIRS&permission=1777&user.name=hdfs", timeout=5).raise_for_status()
    yield server
    server.stop()


@pytest.fixture
def hdfs(hdfs_server) -> WebHdfsBackend:
    return WebHdfsBackend(hdfs_server.url, user="pai")


@pytest.fixture
def on_hdfs(hdfs_server):
    """The whole storage package on WebHDFS, as STORAGE_BACKEND=webhdfs sets it."""
    with override_settings(STORAGE_BACKEND="webhdfs", WEBHDFS_URL=hdfs_server.url, WEBHDFS_USER="pai",
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


def test_it_creates_the_default_output_dir_at_submission(alice) -> None:
    job = services.job_submit(owner=alice, config=json.dumps(config("outdefault", role())))
    # Stored as a full URI; `$PAI_DEFAULT_FS_URI/Output/...` itself reads file:/Output/...
    assert job.config["outputDir"] == f"file:///Output/{alice.username}/outdefault"
    assert storage.backend().stat(f"/Output/{alice.username}/outdefault").is_dir
    services.job_stop(job=job, by=alice)


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


def test_it_stores_and_reads_files_on_hdfs_through_the_datanode(hdfs, hdfs_server) -> None:
    hdfs_server.requests.clear()
    assert hdfs.write("/alice/code/train.py", io.BytesIO(b"print(2)\n")) == 9  # known length
    big = io.BufferedReader(io.BytesIO(b"x" * (3 * MB + 5)))  # no fileno/len: sent chunked
    assert hdfs.write("/alice/data/big.bin", big) == 3 * MB + 5
    assert sum(len(c) for c in hdfs.iter_bytes("/alice/data/big.bin")) == 3 * MB + 5
    seen = {(r.server, r.op) for r in hdfs_server.requests}
    assert {("namenode", "CREATE"), ("datanode", "CREATE"), ("namenode", "OPEN"), ("datanode", "OPEN")} <= seen
    assert {r.user for r in hdfs_server.requests} == {"pai"}
    assert {e.name: e.is_dir for e in hdfs.list("/alice")} == {"code": True, "data": True}
    assert hdfs.stat("/alice/code/train.py").size == 9 and hdfs.stat("/alice/nope") is None
    with pytest.raises(storage.StorageError, match="already exists"):
        hdfs.write("/alice/code/train.py", io.BytesIO(b"again"))
    assert hdfs.write("/alice/code/train.py", io.BytesIO(b"v2"), overwrite=True) == 2
    with pytest.raises(storage.StorageNotFound):
        hdfs.list("/alice/nope")
    with pytest.raises(storage.StorageError, match="not empty"):
        hdfs.delete("/alice/data")
    assert hdfs.delete("/alice/data", recursive=True) and hdfs.delete("/alice/data") is False


def test_it_reports_hdfs_permission_and_existence_errors_as_storage_errors(hdfs, hdfs_server) -> None:
    base = f"{hdfs_server.url}/webhdfs/v1"
    requests.put(f"{base}/locked?op=MKDIRS&permission=755&user.name=hdfs", timeout=5).raise_for_status()
    with pytest.raises(storage.StorageAccessDenied, match="user=pai, access=WRITE"):
        hdfs.write("/locked/file.txt", io.BytesIO(b"x"))
    with pytest.raises(storage.StorageAccessDenied):
        hdfs.mkdir("/locked/sub")
    requests.put(f"{base}/secret?op=MKDIRS&permission=700&user.name=hdfs", timeout=5).raise_for_status()
    with pytest.raises(storage.StorageAccessDenied, match="READ_EXECUTE"):
        hdfs.list("/secret")
    hdfs.write("/alice/file", io.BytesIO(b"x"))
    with pytest.raises(storage.StorageError, match="a file is in the way|not a directory"):
        hdfs.mkdir("/alice/file/sub")
    down = WebHdfsBackend("http://127.0.0.1:9", user="pai")
    with pytest.raises(storage.StorageError, match="did not answer"):
        down.stat("/alice")


def test_it_runs_the_job_storage_contract_on_hdfs(on_hdfs, alice, tmp_path: Path) -> None:
    home = f"/{alice.username}"
    write_tree(tmp_path / "code", {"run.sh": b"echo hi\n", "pkg/mod.py": b"x = 1\n"})
    assert storage.upload_tree(tmp_path / "code", f"{HDFS_URI}{home}/code") == 14
    storage.backend().write(f"{home}/auth", io.BytesIO(b"reg\nalice\npw-secret\n"))
    cfg = config("onhdfs", role(), codeDir=f"{HDFS_URI}{home}/code", dataDir="hdfs:///shared/imagenet",
                 authFile="auth")
    spec = services.parse_for_user(json.dumps(cfg), user=alice).spec
    assert spec.output_dir == f"{HDFS_URI}/Output/{alice.username}/onhdfs"
    assert storage.check_job_paths(user_name=alice.username, is_admin=False, spec=spec) == []
    storage.ensure_output_dir(user_name=alice.username, uri=spec.output_dir)
    assert storage.backend().stat(f"/Output/{alice.username}/onhdfs").is_dir
    assert storage.stage_tree(spec.code_dir, tmp_path / "stage", max_bytes=MB) == 14
    assert (tmp_path / "stage/pkg/mod.py").read_bytes() == b"x = 1\n"
    with pytest.raises(storage.StorageError, match="limit for a code folder"):
        storage.stage_tree(spec.code_dir, tmp_path / "stage2", max_bytes=10)
    assert storage.parse_auth_file(storage.read_small_file(spec.auth_file, max_bytes=100, user_name=alice.username))[2] == "pw-secret"
    bad = config("onhdfs2", role(), codeDir=f"file://{home}/code", outputDir="hdfs://other:9000/x")
    problems = dict(storage.check_job_paths(user_name=alice.username, is_admin=False,
                                            spec=services.parse_for_user(json.dumps(bad), user=alice).spec))
    assert "keeps files on HDFS" in problems["codeDir"] and "not this cluster's HDFS" in problems["outputDir"]


# ------------------------------------------------------------- storage page

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


def test_it_links_a_jobs_folders_to_the_storage_page(alice, bob) -> None:
    from django.template.loader import render_to_string

    storage.backend().mkdir(f"/{alice.username}/code")
    job = services.job_submit(owner=alice, config=json.dumps(config("links", role(), codeDir="code", dataDir="/shared/data")))
    services.job_stop(job=job, by=alice)
    html = render_to_string("jobs/partials/job_storage_links.html", {"job": job, "user": alice})
    assert f'href="/storage/?path=%2F{alice.username}%2Fcode"' in html
    assert f'href="/storage/?path=%2FOutput%2F{alice.username}%2Flinks"' in html
    assert 'href="/storage/?path=%2Fshared%2Fdata"' in html
    as_bob = render_to_string("jobs/partials/job_storage_links.html", {"job": job, "user": bob})
    assert "/storage/?path=%2Fshared%2Fdata" in as_bob and f"%2F{alice.username}%2Fcode" not in as_bob


def test_it_serves_the_storage_page_from_hdfs_with_streamed_uploads(client, alice, on_hdfs) -> None:
    client.force_login(alice)
    home = f"/{alice.username}"
    assert f"{HDFS_URI}{home}" in client.get("/storage/").content.decode()
    big = io.BytesIO(os.urandom(3 * MB))  # past FILE_UPLOAD_MAX_MEMORY_SIZE: Django spools it to a temp file
    big.name = "weights.bin"
    small = io.BytesIO(b"small")
    small.name = "notes.txt"
    saved = client.post("/storage/upload/", {"path": home, "files": [big, small], "names": ["model/weights.bin", "notes.txt"]},
                        headers={"accept": "application/json"})
    assert saved.status_code == 200, saved.content
    creates = [r for r in on_hdfs.requests if r.op == "CREATE" and r.path.startswith(home)]
    assert {(r.server, r.path) for r in creates} >= {("namenode", f"{home}/model/weights.bin"), ("datanode", f"{home}/model/weights.bin")}
    download = client.get("/storage/download/", {"path": f"{HDFS_URI}{home}/model/weights.bin"})
    assert b"".join(download.streaming_content) == big.getvalue() and download["Content-Length"] == str(3 * MB)
    page = client.get("/storage/", {"path": "model"}).content.decode()
    assert "weights.bin" in page and f"/submit/?outputDir=hdfs%3A%2F%2Fnamenode%3A9000%2F{alice.username}%2Fmodel" in page
