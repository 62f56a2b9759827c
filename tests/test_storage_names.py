"""Storage names that could be stored but not used, and uploads that failed
half-way: each was found by review, and is now refused before anything is
stored (tests/test_storage.py holds the rest)."""

from __future__ import annotations

import io
import os

import pytest

from jobs import storage
from jobs.storage import paths
from jobs.storage.errors import StorageError
from jobs.storage.files import UPLOAD_STAGING
from tests.test_storage import hdfs_server, on_hdfs  # noqa: F401  (fixtures)

JSON = {"accept": "application/json"}


def _file(name: str, data: bytes = b"x") -> io.BytesIO:
    item = io.BytesIO(data)
    item.name = name
    return item


@pytest.mark.parametrize("path", ["/alice/#LATEST", "/alice/proj/#LATEST/x", "/alice/out#LATEST", "/alice/#LATEST{2}"])
def test_a_name_hdfs_clients_would_expand_is_refused(path) -> None:
    with pytest.raises(StorageError, match="#LATEST"):
        paths.normalize(path)
    assert paths.normalize("/alice/#LATEST-notes/x") == "/alice/#LATEST-notes/x"  # only at a name's end


def test_deleting_a_file_named_latest_on_hdfs_never_deletes_the_newest_entry(client, alice, on_hdfs) -> None:
    """HdfsCLI expands a name ending in #LATEST to the newest entry of its
    folder on every call but a rename's target: deleting such a file deleted
    (recursively) whatever else in that folder changed last."""
    client.force_login(alice)
    assert client.get("/storage/").status_code == 200  # makes the home
    home = f"/{alice.username}"
    mine = storage.backend().as_user(alice.username)
    mine.write(f"{home}/proj/tmp", io.BytesIO(b"literal"))
    mine.rename(f"{home}/proj/tmp", f"{home}/proj/#LATEST", overwrite=False)  # RENAME's target is literal
    os.utime(on_hdfs.fs.local(f"{home}/proj/#LATEST"), (1_000_000_000, 1_000_000_000))
    mine.write(f"{home}/proj/results/model.bin", io.BytesIO(b"weights"))  # the newest entry
    assert client.get("/storage/download/", {"path": f"{home}/proj/#LATEST"}).status_code == 400
    client.post("/storage/delete/", {"path": f"{home}/proj/#LATEST"})
    assert on_hdfs.fs.exists(f"{home}/proj/results/model.bin")
    page = client.get("/storage/", {"path": f"{home}/proj/#LATEST"})
    assert "model.bin" not in page.content.decode()
    answer = client.post("/storage/upload/", {"path": home, "files": [_file("x")], "names": ["out#LATEST"]},
                         headers=JSON)
    assert answer.status_code == 400 and "#LATEST" in answer.json()["error"]


@pytest.mark.parametrize("name", ["notes.txt ", "dir /notes.txt", " notes.txt", "notes.txt\u00a0"])
def test_a_name_starting_or_ending_with_a_space_is_refused_at_upload(client, alice, name) -> None:
    """Every ?path= is stripped of the spaces around it, so "notes.txt " was
    stored and listed but could never be downloaded or deleted."""
    client.force_login(alice)
    home = f"/{alice.username}"
    answer = client.post("/storage/upload/", {"path": home, "files": [_file("notes.txt", b"mine")], "names": [name]},
                         headers=JSON)
    assert answer.status_code == 400 and "starts or ends with a space" in answer.json()["error"]
    assert storage.backend().stat(home) is None or storage.backend().list(home) == []


def test_an_upload_naming_one_file_twice_is_refused_and_stores_nothing(client, alice) -> None:
    """README: "renamed into place once names, access and quota are checked
    (a refused upload leaves nothing)"."""
    client.force_login(alice)
    home = f"/{alice.username}"
    answer = client.post("/storage/upload/", {"path": home, "files": [_file("a", b"first"), _file("b", b"second")],
                                              "names": ["a.txt", "./a.txt"]}, headers=JSON)
    assert answer.status_code == 400 and "named twice" in answer.json()["error"]
    assert storage.backend().stat(f"{home}/a.txt") is None


def test_an_upload_with_a_file_in_the_way_of_a_later_name_stores_nothing(client, alice) -> None:
    client.force_login(alice)
    home = f"/{alice.username}"
    storage.backend().write(f"{home}/report", io.BytesIO(b"a file"))
    answer = client.post("/storage/upload/", {"path": home, "files": [_file("a", b"1"), _file("b", b"2")],
                                              "names": ["ok.txt", "report/inside.txt"]}, headers=JSON)
    assert answer.status_code == 400 and "is a file" in answer.json()["error"]
    assert storage.backend().stat(f"{home}/ok.txt") is None
    assert storage.backend().list(f"{UPLOAD_STAGING}/{alice.username}") == []
    answer = client.post("/storage/upload/", {"path": home, "files": [_file("a", b"1"), _file("b", b"2")],
                                              "names": ["x", "x/inside.txt"]}, headers=JSON)
    assert answer.status_code == 400 and "both a file and a folder" in answer.json()["error"]
    assert storage.backend().stat(f"{home}/x") is None


def test_a_folder_upload_whose_names_do_not_match_its_files_is_refused_and_stores_nothing(client, alice) -> None:
    """Each file's place was guessed: with one relative path missing (a part
    without a file name), every file went flat into the folder under its
    bare name, and the user was not told."""
    client.force_login(alice)
    home = f"/{alice.username}"
    answer = client.post("/storage/upload/", {"path": home, "files": [_file("a", b"1"), _file("b", b"2")],
                                              "names": ["proj/src/a.py"]}, headers=JSON)
    assert answer.status_code == 400 and "1 relative paths for 2 files" in answer.json()["error"]
    assert storage.backend().stat(f"{home}/a") is None and storage.backend().stat(f"{home}/proj") is None
    plain = client.post("/storage/upload/", {"path": home, "files": [_file("c.txt", b"3")]}, headers=JSON)
    assert plain.status_code == 200 and storage.backend().stat(f"{home}/c.txt") is not None
