"""Storage at its edges, from review (each test failed before its fix): a
download of a file replaced meanwhile, an upload larger than the quota,
a write over a file on HDFS that fails midway, a name too long for
storage, and a data file that grows while a node copies it. The two HDFS
tests run on the minicluster (tests/hdfs_cluster.py)."""

from __future__ import annotations

import io
import time

import pytest
from django.test import Client, override_settings

from jobs import storage
from jobs.storage import files, uploads
from jobs.storage.local import LocalBackend
from jobs.storage.webhdfs import WebHdfsBackend
from tests.hdfs_cluster import SERVICE_USER

MB = 1024 * 1024


def test_a_download_sends_the_file_it_opened_even_when_it_is_replaced_before_it_is_read(alice) -> None:
    home = f"/{alice.username}"
    storage.backend().write(f"{home}/model.bin", io.BytesIO(b"old" * 10))
    reader = storage.reader_for(user_name=alice.username, is_admin=False)
    entry, chunks = files.file_read(reader, f"{home}/model.bin")
    # A new version is uploaded (moved into place whole) before the client reads a byte.
    storage.backend().write(f"{home}/model.bin", io.BytesIO(b"NEW" * 20), overwrite=True)
    body = b"".join(chunks)
    assert entry.size == len(body)
    assert body == b"old" * 10


def test_an_upload_stops_being_stored_once_it_holds_more_than_the_quota(alice, alice_client, settings,
                                                                         monkeypatch) -> None:
    """The staging folder is outside the quota while a request's files
    arrive: a file of any size was stored whole (filling the disk for
    everyone) before the quota refused it."""
    settings.STORAGE_QUOTA_MB, settings.STORAGE_QUOTA_FILES = 1, 0
    stored: list[int] = []
    write_new = LocalBackend.write_new

    def counting(self, path: str, pieces):
        def counted():
            for piece in pieces:
                stored.append(len(piece))
                yield piece
        return write_new(self, path, counted())

    monkeypatch.setattr(LocalBackend, "write_new", counting)
    big = io.BytesIO(b"x" * 8 * MB)
    big.name = "big.bin"
    refused = alice_client.post("/storage/upload/", {"path": f"/{alice.username}", "files": [big]},
                                headers={"accept": "application/json"})
    assert refused.status_code == 413
    assert "storage quota" in refused.json()["error"]
    assert sum(stored) <= MB + uploads.READ_SIZE
    staged = storage.backend().root / files.UPLOAD_STAGING.lstrip("/") / alice.username
    assert staged.is_dir() and not list(staged.iterdir())  # what was stored is removed
    assert storage.backend().stat(f"/{alice.username}/big.bin") is None


class _BreaksMidway:
    """A local file whose reading fails after its first 512 KB (a disk
    error, a node agent going down as it uploads a task's output)."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        if self.reads > 2:
            raise OSError("the output could not be read")
        return b"n" * (256 * 1024)


@pytest.mark.services
def test_a_write_over_a_file_on_hdfs_that_fails_midway_keeps_the_old_file(hdfs_cluster, alice) -> None:
    """An output upload replaces what an earlier attempt left in outputDir.
    HDFS's CREATE with overwrite truncates the old file at once: a write
    that failed midway left half of the new file where the old one was."""
    service = WebHdfsBackend(hdfs_cluster.url, user=SERVICE_USER)
    home = f"/{alice.username}"
    service.make_home(home, owner=alice.username)
    mine = service.as_user(alice.username)
    mine.write(f"{home}/out/model.bin", io.BytesIO(b"old model"))
    with pytest.raises((OSError, storage.StorageError)):
        mine.write(f"{home}/out/model.bin", _BreaksMidway(), overwrite=True)
    time.sleep(1)  # the datanode closes what it was sent once it sees the end
    assert b"".join(mine.iter_bytes(f"{home}/out/model.bin")) == b"old model"
    assert [e.name for e in mine.list(f"{home}/out")] == ["model.bin"]
    listing = hdfs_cluster.webhdfs("GET", f"{home}/out", op="LISTSTATUS").json()["FileStatuses"]["FileStatus"]
    assert [s["pathSuffix"] for s in listing] == ["model.bin"]  # no hidden partial file left either


@pytest.mark.services
def test_an_upload_with_a_name_too_long_for_storage_stores_none_of_its_files(hdfs_cluster, alice) -> None:
    """HDFS (like most file systems) takes names of at most 255 bytes, and
    found out only as the files were moved into place: the files before
    the long name were stored by an upload that was refused."""
    long_name = "é" * 128  # 256 bytes in UTF-8
    with override_settings(**hdfs_cluster.portal_settings()):
        client = Client()
        client.force_login(alice)
        home = f"/{alice.username}"
        first, second = io.BytesIO(b"first"), io.BytesIO(b"second")
        first.name, second.name = "a.txt", "b.txt"
        refused = client.post("/storage/upload/", {"path": home, "files": [first, second],
                                                   "names": ["a.txt", long_name]},
                              headers={"accept": "application/json"})
        assert refused.status_code == 400 and "longer than 255 bytes" in refused.json()["error"]
        assert storage.backend().stat(f"{home}/a.txt") is None


def test_a_data_file_that_grows_as_it_is_staged_is_copied_no_further_than_the_limit(alice, tmp_path,
                                                                                     monkeypatch) -> None:
    """A dataDir of one file was copied to the node until its end, however
    far it had grown (appended meanwhile) past DATA_DIR_MAX_MB: a folder's
    files stop at the limit."""
    path = f"/{alice.username}/data.bin"
    storage.backend().write(path, io.BytesIO(b"d" * 500), overwrite=True)
    real = storage.backend().root / path.lstrip("/")
    open_file = LocalBackend._open

    def appended_meanwhile(self, opened: str):
        with open(real, "ab") as out:  # another writer, between the look and the read
            out.write(b"g" * 5000)
        return open_file(self, opened)

    monkeypatch.setattr(LocalBackend, "_open", appended_meanwhile)
    with pytest.raises(storage.StorageError, match="grew past"):
        storage.stage_data(path, tmp_path / "data", max_bytes=1000)
    assert (tmp_path / "data" / "data.bin").stat().st_size <= 1000


def test_a_data_folder_that_grows_past_its_limit_is_named_as_data_not_code(alice, tmp_path) -> None:
    """A dataDir folder past DATA_DIR_MAX_MB once copying began was called a
    code folder, with advice to put the data in dataDir."""
    folder = f"/{alice.username}/grows"
    storage.backend().write(f"{folder}/a.bin", io.BytesIO(b"a" * 800), overwrite=True)
    real = storage.backend().root / folder.lstrip("/")
    look = LocalBackend.usage

    def written_meanwhile(self, path: str):
        measured = look(self, path)
        (real / "b.bin").write_bytes(b"b" * 800)  # another writer, between the look and the copy
        return measured

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalBackend, "usage", written_meanwhile)
        with pytest.raises(storage.StorageError) as refused:
            storage.stage_data(folder, tmp_path / "data", max_bytes=1000)
    assert "the limit for dataDir" in str(refused.value) and "code" not in str(refused.value)


def test_an_upload_whose_move_fails_part_way_leaves_the_kept_usage_right(alice, settings) -> None:
    """The kept usage (quota.py) was only added to once every file had been
    moved: one cut short after some were in place left it behind what the
    home held, so the next uploads passed the quota by that much."""
    from jobs.storage import quota

    settings.STORAGE_QUOTA_MB, settings.STORAGE_QUOTA_FILES, settings.STORAGE_USAGE_CACHE_SECONDS = 10, 0, 300
    reader = storage.reader_for(user_name=alice.username, is_admin=False)
    home = f"/{alice.username}"
    storage.backend().write(f"{home}/old.bin", io.BytesIO(b"o" * 100), overwrite=True)
    quota.forget(alice.username)
    before = quota.usage_of(alice.username)  # measured and kept
    staging = files.upload_staging(reader)
    staged = []
    for name, size in (("a.bin", 1000), ("b.bin", 2000)):
        temp = f"{staging.folder}/{name}.part"
        storage.backend().write(temp, io.BytesIO(b"x" * size), overwrite=True)
        staged.append((f"cut/{name}", uploads.StagedFile(name=name, temp=temp, size=size)))
    storage.backend().delete(staged[1][1].temp, recursive=False)  # gone before its move: the move fails there
    with pytest.raises(storage.StorageError):
        files.files_save(reader, home, staged, overwrite=False)
    assert storage.backend().stat(f"{home}/cut/a.bin") is not None  # the first was moved
    measured = [storage.backend().usage(folder) for folder in (home, f"/Output/{alice.username}")]
    real = quota.Usage(sum(u[0] for u in measured), sum(u[1] for u in measured))
    assert real == quota.Usage(before.bytes + 1000, before.files + 1)
    assert quota.usage_of(alice.username) == real


def test_an_output_upload_cut_short_leaves_the_kept_usage_right(alice, settings, tmp_path) -> None:
    from jobs.storage import quota

    settings.STORAGE_QUOTA_MB, settings.STORAGE_QUOTA_FILES, settings.STORAGE_USAGE_CACHE_SECONDS = 10, 0, 300
    home = f"/{alice.username}"
    storage.backend().mkdir(f"{home}/out/b.txt")  # a folder where the second file must go
    quota.forget(alice.username)
    before = quota.usage_of(alice.username)
    (tmp_path / "a.txt").write_bytes(b"a" * 700)
    (tmp_path / "b.txt").write_bytes(b"b" * 300)
    with pytest.raises(storage.StorageError):
        storage.upload_tree(tmp_path, f"file://{home}/out", user_name=alice.username)
    assert storage.backend().stat(f"{home}/out/a.txt") is not None
    assert quota.usage_of(alice.username) == quota.Usage(before.bytes + 700, before.files + 1)
