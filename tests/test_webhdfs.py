"""The WebHDFS backend (jobs/storage/webhdfs.py) against a real HDFS: Hadoop's
MiniDFSCluster with WebHDFS and permissions on (tests/hdfs_cluster.py, one
JVM per session). Files, folders and errors; each portal user's requests
running as that user (doas) in homes HDFS gives them; HDFS itself refusing
one user another's home; the job storage contract and the storage page.

Jobs on HDFS end to end (node agents, gunicorn, Docker) are in
test_webhdfs_jobs.py. The protocol server tests/webhdfs_server.py is kept
only for watching the exact requests the portal sends (test_storage.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest
from django.test import override_settings

from jobs import services, storage
from jobs.storage import access
from jobs.storage.webhdfs import WebHdfsBackend
from tests.hdfs_cluster import SERVICE_USER
from tests.helpers import config, role

pytestmark = pytest.mark.services

MB = 1024 * 1024


@pytest.fixture
def service(hdfs_cluster) -> WebHdfsBackend:
    """The portal's own backend on the minicluster (the service user)."""
    return WebHdfsBackend(hdfs_cluster.url, user=SERVICE_USER)


@pytest.fixture
def on_real_hdfs(hdfs_cluster):
    """The whole storage package on the minicluster, as STORAGE_BACKEND=webhdfs sets it."""
    with override_settings(**hdfs_cluster.portal_settings()):
        yield hdfs_cluster


def reader(user, *, admin: bool = False) -> access.Reader:
    return storage.reader_for(user_name=user.username, is_admin=admin)


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


# ------------------------------------------------------ files and folders

def test_it_writes_lists_reads_and_deletes_files_on_hdfs(service, hdfs_cluster, alice, tmp_path: Path) -> None:
    home = f"/{alice.username}"
    service.make_home(home, owner=alice.username)
    mine = service.as_user(alice.username)
    known = tmp_path / "train.py"
    known.write_bytes(b"print(2)\n")
    with open(known, "rb") as stream:  # a real file
        assert mine.write(f"{home}/code/train.py", stream) == 9
    data = os.urandom(3 * MB + 5)
    chunked = io.BufferedReader(io.BytesIO(data))  # no length, no fileno: sent in chunks
    assert mine.write(f"{home}/data/big.bin", chunked) == 3 * MB + 5
    streamed = list(mine.iter_bytes(f"{home}/data/big.bin"))
    assert len(streamed) > 1 and max(len(c) for c in streamed) <= MB  # downloaded in chunks, not whole
    assert hashlib.sha256(b"".join(streamed)).digest() == hashlib.sha256(data).digest()
    assert hdfs_cluster.read(f"{home}/data/big.bin") == data  # what another HDFS client reads

    assert {e.name: e.is_dir for e in mine.list(home)} == {"code": True, "data": True}
    assert mine.stat(f"{home}/code/train.py").size == 9 and mine.stat(f"{home}/nope") is None
    assert mine.stat(f"{home}/code").modified is not None
    assert hdfs_cluster.status(f"{home}/code/train.py")["owner"] == alice.username  # written as alice
    with pytest.raises(storage.StorageError, match="already exists"):
        mine.write(f"{home}/code/train.py", io.BytesIO(b"again"))
    assert mine.write(f"{home}/code/train.py", io.BytesIO(b"v2"), overwrite=True) == 2
    assert b"".join(mine.iter_bytes(f"{home}/code/train.py")) == b"v2"
    mine.mkdir(f"{home}/empty/deeper")
    mine.mkdir(f"{home}/empty/deeper")  # fine when it exists
    assert mine.stat(f"{home}/empty/deeper").is_dir

    with pytest.raises(storage.StorageNotFound):
        mine.list(f"{home}/nope")
    with pytest.raises(storage.StorageError, match="not empty"):
        mine.delete(f"{home}/data")
    assert mine.delete(f"{home}/data", recursive=True) and mine.delete(f"{home}/data") is False
    assert mine.stat(f"{home}/data") is None


def test_it_reports_hdfs_errors_as_storage_errors(service, hdfs_cluster, alice, tmp_path: Path) -> None:
    home = f"/{alice.username}"
    service.make_home(home, owner=alice.username)
    mine = service.as_user(alice.username)
    locked = f"/locked-{alice.username}"
    service.mkdir(locked)  # 755, the service user's
    with pytest.raises(storage.StorageAccessDenied, match=f"user={alice.username}, access=WRITE"):
        mine.write(f"{locked}/file.txt", io.BytesIO(b"x"))
    with pytest.raises(storage.StorageAccessDenied):
        mine.mkdir(f"{locked}/sub")
    hidden = f"{locked}/hidden"
    service.mkdir(hidden)
    service.client.set_permission(hidden, permission="700")
    with pytest.raises(storage.StorageAccessDenied, match="READ_EXECUTE"):
        mine.list(hidden)

    mine.write(f"{home}/file", io.BytesIO(b"x"))
    with pytest.raises(storage.StorageError, match="a file is in the way|not a directory"):
        mine.mkdir(f"{home}/file/sub")
    with pytest.raises(storage.StorageError, match="a file is in the way|not a directory"):
        mine.write(f"{home}/file/inner.txt", io.BytesIO(b"x"))
    with pytest.raises(storage.StorageError, match="is a file; expected a folder"):
        mine.list(f"{home}/file")
    with pytest.raises(storage.StorageError, match="is a file; expected a folder"):
        mine.download_tree(f"{home}/file", tmp_path / "stage", max_bytes=MB)
    with pytest.raises(storage.StorageError, match="is a folder; expected a file"):
        b"".join(mine.iter_bytes(home))
    with pytest.raises(storage.StorageNotFound):
        b"".join(mine.iter_bytes(f"{home}/missing.txt"))
    with pytest.raises(storage.StorageAccessDenied, match="root cannot be deleted"):
        service.delete("/", recursive=True)

    down = WebHdfsBackend("http://127.0.0.1:9", user=SERVICE_USER)
    with pytest.raises(storage.StorageError, match="did not answer"):
        down.stat("/")


def test_a_new_file_from_pieces_streams_to_the_datanode_and_a_broken_one_leaves_nothing(service, hdfs_cluster,
                                                                                         alice) -> None:
    """write_new (a storage-page upload): pieces of every size, views and
    empty ones, grouped into chunks; a failure of the pieces, of the
    namenode's CREATE or of the datanode's answer removes the file."""
    from jobs.storage import webhdfs

    home = f"/{alice.username}"
    service.make_home(home, owner=alice.username)
    mine = service.as_user(alice.username)
    data = os.urandom(3 * MB + 5)
    tiny = [data[at:at + 1] for at in range(webhdfs.SEND_PIECES * 2)]  # more than one sendmsg may take
    rest = memoryview(data)[len(tiny):]
    pieces = [*tiny, b"", rest[:MB], rest[MB:MB + 7], b"", rest[MB + 7:]]
    assert mine.write_new(f"{home}/pieces.bin", iter(pieces)) == len(data)
    assert hdfs_cluster.read(f"{home}/pieces.bin") == data
    assert hdfs_cluster.status(f"{home}/pieces.bin")["owner"] == alice.username

    def broken():
        yield os.urandom(2 * MB)
        raise ValueError("the client went away")
    with pytest.raises(ValueError, match="went away"):
        mine.write_new(f"{home}/broken.bin", broken())
    assert hdfs_cluster.status(f"{home}/broken.bin") is None

    with pytest.raises(storage.StorageError, match="already exists"):
        mine.write_new(f"{home}/pieces.bin", iter([b"x"]))
    assert hdfs_cluster.read(f"{home}/pieces.bin") == data
    with pytest.raises(storage.StorageAccessDenied, match="access=WRITE") as refused:
        mine.write_new("/not-mine.bin", iter([b"x"]))
    assert "\tat org.apache" not in str(refused.value)  # the datanode's stack trace is not for users

    # The datanode's own refusal, in its words: a space quota below one block.
    limited = f"{home}/limited"
    mine.mkdir(limited)
    hdfs_cluster.webhdfs("PUT", limited, op="SETQUOTA", namespacequota="-1", storagespacequota=str(MB))
    with pytest.raises(storage.StorageQuotaExceeded, match="HDFS's own quota"):
        mine.write_new(f"{limited}/big.bin", iter([os.urandom(MB)] * 3))
    assert hdfs_cluster.status(f"{limited}/big.bin") is None

    down = WebHdfsBackend("http://127.0.0.1:9", user=SERVICE_USER)
    with pytest.raises(storage.StorageUnavailable, match="did not answer"):
        down._send_to_datanode("http://127.0.0.1:9/webhdfs/v1/x?op=CREATE", iter([b"x"]))


# ------------------------------------------------ HDFS enforces who is who

def test_it_makes_homes_that_only_their_user_may_open_and_hdfs_itself_refuses_others(
        client, on_real_hdfs, alice, bob) -> None:
    client.force_login(alice)
    assert client.get("/storage/").status_code == 200  # the first visit makes the home
    home = f"/{alice.username}"
    status = on_real_hdfs.status(home)
    assert (status["owner"], status["permission"]) == (alice.username, "700")
    upload = io.BytesIO(b"alice's notes")
    upload.name = "notes.txt"
    assert client.post("/storage/upload/", {"path": home, "files": [upload]},
                       headers={"accept": "application/json"}).status_code == 200
    assert on_real_hdfs.status(f"{home}/notes.txt")["owner"] == alice.username

    # HDFS itself, asked directly as bob, refuses: list, read, write.
    for method, path, op in (("GET", home, "LISTSTATUS"), ("GET", f"{home}/notes.txt", "OPEN"),
                             ("PUT", f"{home}/bob.txt", "CREATE"), ("DELETE", f"{home}/notes.txt", "DELETE")):
        refused = on_real_hdfs.webhdfs(method, path, user=bob.username, op=op, data=b"x")
        assert refused.status_code == 403, (op, refused.text)
        assert refused.json()["RemoteException"]["exception"] == "AccessControlException"
        assert f"user={bob.username}" in refused.json()["RemoteException"]["message"]
    assert on_real_hdfs.read(f"{home}/notes.txt", user=alice.username) == b"alice's notes"
    # ... and so does it when the portal acts for bob past its own rules.
    as_bob = storage.backend().as_user(bob.username)
    with pytest.raises(storage.StorageAccessDenied, match=f"user={bob.username}"):
        as_bob.list(home)
    with pytest.raises(storage.StorageAccessDenied):
        as_bob.write(f"{home}/x.txt", io.BytesIO(b"x"))
    # A user who is not the portal's proxy user cannot act for alice.
    impersonating = on_real_hdfs.webhdfs("GET", home, user=bob.username, op="LISTSTATUS", doas=alice.username)
    assert impersonating.status_code == 403 and "is not allowed to impersonate" in impersonating.text

    # Outputs: /Output/<user> is made as a job's first task starts (the
    # node's ensure_output_dir, as the job's owner), alice's alone as well.
    job = services.job_submit(owner=alice, config=json.dumps(config("homes", role())))
    services.job_stop(job=job, by=alice)
    assert on_real_hdfs.status(f"/Output/{alice.username}/homes") is None  # submission only looked
    storage.ensure_output_dir(uri=job.config["outputDir"], reader=reader(alice))
    output_home = on_real_hdfs.status(f"/Output/{alice.username}")
    assert (output_home["owner"], output_home["permission"]) == (alice.username, "700")
    assert on_real_hdfs.status(f"/Output/{alice.username}/homes")["owner"] == alice.username
    assert on_real_hdfs.status("/Output")["permission"] == "755"

    # A portal user named like the service user would get its superuser powers: refused.
    with pytest.raises(storage.StorageAccessDenied, match="name of the HDFS service user"):
        storage.backend().as_user(SERVICE_USER)


def test_it_lets_admins_act_as_the_service_user(client, on_real_hdfs, alice, admin_user) -> None:
    home = f"/{alice.username}"
    storage.ensure_home(reader(alice), home)
    storage.backend_for(reader(alice)).write(f"{home}/private.txt", io.BytesIO(b"mine"))
    client.force_login(admin_user)
    download = client.get("/storage/download/", {"path": f"{home}/private.txt"})
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"mine"


# ------------------------------------------------------ the job contract

def test_it_runs_the_job_storage_contract_on_hdfs(on_real_hdfs, alice, admin_user, tmp_path: Path) -> None:
    fs = on_real_hdfs.fs_uri
    home = f"/{alice.username}"
    me = reader(alice)
    write_tree(tmp_path / "code", {"run.sh": b"echo hi\n", "pkg/mod.py": b"x = 1\n"})
    assert storage.upload_tree(tmp_path / "code", f"{fs}{home}/code", reader=me) == 14
    storage.backend_for(me).write(f"{home}/auth", io.BytesIO(b"reg\nalice\npw-secret\n"))
    cfg = config("onhdfs", role(), codeDir=f"{fs}{home}/code", dataDir="hdfs:///shared/imagenet", authFile="auth")
    spec = services.parse_for_user(json.dumps(cfg), user=alice).spec
    assert spec.output_dir == f"{fs}/Output/{alice.username}/onhdfs"
    assert storage.check_job_paths(user_name=alice.username, is_admin=False, spec=spec) == []
    storage.ensure_output_dir(uri=spec.output_dir, reader=me)
    assert on_real_hdfs.status(f"/Output/{alice.username}/onhdfs")["owner"] == alice.username
    assert storage.stage_tree(spec.code_dir, tmp_path / "stage", max_bytes=MB, reader=me) == 14
    assert (tmp_path / "stage/pkg/mod.py").read_bytes() == b"x = 1\n"
    with pytest.raises(storage.StorageError, match="limit for a code folder"):
        storage.stage_tree(spec.code_dir, tmp_path / "stage2", max_bytes=10, reader=me)
    # dataDir: a folder or one file is copied up to the limit; a bigger one is left alone.
    write_tree(tmp_path / "data", {"train/a.csv": b"1,2\n", "b.csv": b"3,4,5\n"})
    storage.upload_tree(tmp_path / "data", f"{home}/data", reader=me)
    assert storage.stage_data(f"{fs}{home}/data", tmp_path / "d1", max_bytes=MB, reader=me) == (10, True)
    assert (tmp_path / "d1/train/a.csv").read_bytes() == b"1,2\n"
    assert storage.stage_data(f"{home}/data/b.csv", tmp_path / "d2", max_bytes=MB, reader=me) == (6, True)
    assert (tmp_path / "d2/b.csv").read_bytes() == b"3,4,5\n"
    assert storage.stage_data("data", tmp_path / "d3", max_bytes=9, user_name=alice.username, reader=me) == (10, False)
    assert not (tmp_path / "d3").exists()
    with pytest.raises(storage.StorageNotFound):
        storage.stage_data(f"{home}/nodata", tmp_path / "d4", max_bytes=MB, reader=me)
    auth = storage.read_small_file(spec.auth_file, max_bytes=100, user_name=alice.username, reader=me)
    assert storage.parse_auth_file(auth)[2] == "pw-secret"

    # The portal's rules allow everyone to read shared folders; a shared
    # folder an admin closed on HDFS is refused by HDFS, and said so.
    admin = reader(admin_user, admin=True)
    storage.backend_for(admin).mkdir("/shared/closed-code")
    storage.backend().client.set_permission("/shared/closed-code", permission="700")
    closed = services.parse_for_user(json.dumps(config("closed", role(), codeDir="/shared/closed-code")), user=alice)
    problems = dict(storage.check_job_paths(user_name=alice.username, is_admin=False, spec=closed.spec))
    assert "HDFS refuses access to /shared/closed-code" in problems["codeDir"]
    assert f"user={alice.username}" in problems["codeDir"]

    bad = config("onhdfs2", role(), codeDir=f"file://{home}/code", outputDir="hdfs://other:9000/x")
    problems = dict(storage.check_job_paths(user_name=alice.username, is_admin=False,
                                            spec=services.parse_for_user(json.dumps(bad), user=alice).spec))
    assert "keeps files on HDFS" in problems["codeDir"] and "not this cluster's HDFS" in problems["outputDir"]


# ------------------------------------------------------- the storage page

def test_it_serves_the_storage_page_from_hdfs_with_streamed_uploads(client, alice, on_real_hdfs) -> None:
    fs = on_real_hdfs.fs_uri
    client.force_login(alice)
    home = f"/{alice.username}"
    assert f"{fs}{home}" in client.get("/storage/").content.decode()
    big = io.BytesIO(os.urandom(3 * MB))  # past FILE_UPLOAD_MAX_MEMORY_SIZE, yet no temporary file on the portal
    big.name = "weights.bin"
    small = io.BytesIO(b"small")
    small.name = "notes.txt"
    with override_settings(FILE_UPLOAD_TEMP_DIR="/nonexistent/uploads"):  # Django's own handlers would fail here
        saved = client.post("/storage/upload/", {"path": home, "files": [big, small],
                                                 "names": ["model/weights.bin", "notes.txt"]},
                            headers={"accept": "application/json"})
    assert saved.status_code == 200, saved.content
    assert on_real_hdfs.status(f"{home}/model/weights.bin")["owner"] == alice.username
    assert on_real_hdfs.read(f"{home}/model/weights.bin") == big.getvalue()
    download = client.get("/storage/download/", {"path": f"{fs}{home}/model/weights.bin"})
    assert b"".join(download.streaming_content) == big.getvalue() and download["Content-Length"] == str(3 * MB)
    page = client.get("/storage/", {"path": "model"}).content.decode()
    quoted = fs.replace(":", "%3A").replace("/", "%2F")
    assert "weights.bin" in page and f"/submit/?outputDir={quoted}%2F{alice.username}%2Fmodel" in page
    assert client.post("/storage/folder/", {"path": home, "name": "results"}).status_code == 302
    assert on_real_hdfs.status(f"{home}/results")["owner"] == alice.username
    assert client.post("/storage/delete/", {"path": f"{home}/model"}).status_code == 302
    assert on_real_hdfs.status(f"{home}/model") is None
    missing = client.get("/storage/download/", {"path": f"{home}/nope.bin"})
    assert missing.status_code == 404


def test_it_downloads_from_hdfs_only_what_the_portal_lets_the_user_read(client, alice, bob, on_real_hdfs) -> None:
    """A download is one OPEN as the user (no stat before it): the portal's
    rules still come first, a folder is still named as one."""
    from django.test import Client

    home = f"/{alice.username}"
    storage.ensure_home(reader(alice), home)
    storage.backend_for(reader(alice)).write(f"{home}/notes.txt", io.BytesIO(b"alice's"))
    client.force_login(alice)
    mine = client.get("/storage/download/", {"path": f"{home}/notes.txt"})
    assert mine.status_code == 200 and mine["Content-Length"] == "7" and b"".join(mine.streaming_content) == b"alice's"
    folder = client.get("/storage/download/", {"path": home})
    assert folder.status_code == 400 and f"{home} is a folder; expected a file" in folder.content.decode()
    other = Client()
    other.force_login(bob)
    refused = other.get("/storage/download/", {"path": f"{home}/notes.txt"})
    assert refused.status_code == 403 and b"alice's" not in refused.content
    anonymous = Client().get("/storage/download/", {"path": f"{home}/notes.txt"})
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def hidden_uploads(hdfs_cluster, user) -> list[str]:
    """What is left in the user's upload staging folder (and hidden files in their home)."""
    left = []
    for folder in (f"/.pai-upload-staging/{user.username}", f"/{user.username}"):
        listing = hdfs_cluster.webhdfs("GET", folder, op="LISTSTATUS").json()["FileStatuses"]["FileStatus"]
        left += [s["pathSuffix"] for s in listing if s["pathSuffix"].startswith(".pai-upload-") or "staging" in folder]
    return left


def test_it_leaves_nothing_of_a_refused_upload_on_hdfs(client, alice, bob, on_real_hdfs) -> None:
    from django.test import Client

    home = f"/{alice.username}"
    client.force_login(alice)
    first = io.BytesIO(b"v1")
    first.name = "model.txt"
    assert client.post("/storage/upload/", {"path": home, "files": [first]}).status_code == 302
    for folder, expected in ((home, 409), (f"/{bob.username}", 403)):  # a conflict; another user's home
        again = io.BytesIO(os.urandom(2 * MB))
        again.name = "model.txt"
        refused = client.post("/storage/upload/", {"path": folder, "files": [again]}, headers={"accept": "application/json"})
        assert refused.status_code == expected, refused.content
    with override_settings(STORAGE_QUOTA_MB=1):
        big = io.BytesIO(os.urandom(2 * MB))
        big.name = "big.bin"
        refused = client.post("/storage/upload/", {"path": home, "files": [big]}, headers={"accept": "application/json"})
        assert refused.status_code == 413, refused.content
    strict = Client(enforce_csrf_checks=True)  # a form posted from another site: no CSRF token
    strict.force_login(alice)
    forged = io.BytesIO(b"forged")
    forged.name = "forged.txt"
    assert strict.post("/storage/upload/", {"path": home, "files": [forged]}).status_code == 403
    assert on_real_hdfs.read(f"{home}/model.txt") == b"v1"
    assert on_real_hdfs.status(f"{home}/forged.txt") is None and on_real_hdfs.status(f"{home}/big.bin") is None
    assert hidden_uploads(on_real_hdfs, alice) == []
    assert [e["pathSuffix"] for e in on_real_hdfs.webhdfs("GET", home, op="LISTSTATUS").json()["FileStatuses"]["FileStatus"]] \
        == ["model.txt"]
    # Replacing goes through HDFS's atomic rename with OVERWRITE.
    newer = io.BytesIO(b"v2")
    newer.name = "model.txt"
    assert client.post("/storage/upload/", {"path": home, "files": [newer], "overwrite": "1"}).status_code == 302
    assert on_real_hdfs.read(f"{home}/model.txt") == b"v2" and hidden_uploads(on_real_hdfs, alice) == []
    # The staging folder is the user's own, closed to others, and not listed.
    staging = on_real_hdfs.status(f"/.pai-upload-staging/{alice.username}")
    assert (staging["owner"], staging["permission"]) == (alice.username, "700")
    assert ".pai-upload-staging" not in client.get("/storage/", {"path": "/"}).content.decode()
