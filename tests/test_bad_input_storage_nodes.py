"""Bad input that used to answer 500 or store what then broke pages: storage
paths deeper than storage can take (both backends), upload parts whose
RFC 2231 file name cannot be decoded, and node rows edited in the admin into
shapes no agent writes. Each through the real endpoint with Django's test
client; WebHDFS on the protocol server (tests/webhdfs_server.py), no Docker."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest
from django.test import Client

from jobs import storage
from jobs.models import Node
from jobs.storage import paths
from jobs.storage.files import UPLOAD_STAGING
from tests.test_storage import hdfs_server, on_hdfs  # noqa: F401  (fixtures)
from tests.webhdfs_server import WebHdfsServer

DEEP = "d/" * 1500  # the audit's name: 1,500 folders
JSON = {"accept": "application/json"}
BOUNDARY = "pai-test-boundary"


def _file(name: str, data: bytes = b"x") -> io.BytesIO:
    item = io.BytesIO(data)
    item.name = name
    return item


def _page(response) -> str:
    """A refused form's redirect, followed: the page with its message."""
    return response.content.decode().replace("&quot;", '"')


# ------------------------------------------------------------- deep paths


def test_it_refuses_a_folder_name_deeper_than_a_storage_path_may_be(client, alice) -> None:
    client.force_login(alice)
    home = f"/{alice.username}"
    refused = client.post("/storage/folder/", {"path": home, "name": DEEP}, follow=True)
    assert refused.status_code == 200
    text = _page(refused)
    assert "Could not make the folder: the folder name" in text and "has 1500 parts" in text
    assert f"at most {paths.MAX_DEPTH}" in text
    assert storage.backend().stat(f"{home}/d") is None


def test_it_refuses_a_deep_folder_in_the_path_field_too(client, alice) -> None:
    client.force_login(alice)
    refused = client.post("/storage/folder/", {"path": f"/{alice.username}/{DEEP}", "name": "x"}, follow=True)
    # Back to the folder it was asked for, which the storage page refuses too (400, not 500).
    assert refused.status_code == 400 and "Could not make the folder: " in _page(refused)
    assert "has 1501 parts" in _page(refused)


def test_it_makes_a_folder_exactly_as_deep_as_allowed_and_not_one_deeper(client, alice) -> None:
    client.force_login(alice)
    home = f"/{alice.username}"
    deepest = "/".join(["d"] * (paths.MAX_DEPTH - 1))  # under /<user>: MAX_DEPTH parts
    assert client.post("/storage/folder/", {"path": home, "name": deepest}).status_code == 302
    assert storage.backend().stat(f"{home}/{deepest}").is_dir
    one_more = client.post("/storage/folder/", {"path": f"{home}/{deepest}", "name": "e"}, follow=True)
    assert f"has {paths.MAX_DEPTH + 1} parts" in _page(one_more)
    assert storage.backend().stat(f"{home}/{deepest}/e") is None


def test_it_refuses_an_upload_whose_relative_name_is_too_deep_and_keeps_nothing(client, alice) -> None:
    client.force_login(alice)
    home = f"/{alice.username}"
    refused = client.post("/storage/upload/", {"path": home, "files": [_file("x.txt")], "names": [DEEP + "x.txt"]},
                          headers=JSON)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error.startswith('the file name "d/d/d/') and "has 1501 parts" in error
    assert len(error) < 300  # the name is quoted only in part
    assert storage.backend().stat(f"{home}/d") is None
    assert storage.backend().list(f"{UPLOAD_STAGING}/{alice.username}") == []


# ------------------------------------------------ the same check on WebHDFS


def _deepest_request(server: WebHdfsServer) -> int:
    """How many parts the deepest path HDFS was asked about has."""
    return max((len([p for p in r.path.split("/") if p]) for r in server.requests), default=0)


def test_it_refuses_deep_paths_on_webhdfs_before_asking_hdfs(client, alice, on_hdfs) -> None:
    client.force_login(alice)
    home = f"/{alice.username}"
    assert client.get("/storage/").status_code == 200  # makes the home
    on_hdfs.requests.clear()
    refused = client.post("/storage/folder/", {"path": home, "name": DEEP}, follow=True)
    assert "the folder name" in _page(refused) and "has 1500 parts" in _page(refused)
    upload = client.post("/storage/upload/", {"path": home, "files": [_file("x.txt")], "names": [DEEP + "x.txt"]},
                         headers=JSON)
    assert upload.status_code == 400 and "has 1501 parts" in upload.json()["error"]
    assert "MKDIRS" not in {r.op for r in on_hdfs.requests if r.path.startswith(f"{home}/")}
    assert _deepest_request(on_hdfs) <= 3  # /.pai-upload-staging/<user>/<temp name>: nothing deep reached HDFS
    assert not on_hdfs.fs.exists(f"{home}/d")


def test_a_tasks_output_too_deep_for_storage_is_refused_before_any_folder_is_made(alice, on_hdfs,
                                                                                 tmp_path: Path) -> None:
    """The node uploads a task's output with upload_tree, which makes the
    folders itself (no user typed these paths): the same limit applies."""
    deep = tmp_path.joinpath(*["d"] * (paths.MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    (deep / "result.txt").write_bytes(b"42")
    on_hdfs.requests.clear()
    reader = storage.reader_for(user_name=alice.username, is_admin=False)
    with pytest.raises(storage.StorageError, match=f"has {paths.MAX_DEPTH + 1} parts; a storage path may have"):
        storage.upload_tree(tmp_path, f"/Output/{alice.username}/deep", reader=reader)
    assert not [r for r in on_hdfs.requests if r.op in ("MKDIRS", "CREATE") and "/deep" in r.path]
    assert not on_hdfs.fs.exists(f"/Output/{alice.username}/deep")


# ------------------------------------------- multipart parameters (RFC 2231)


def _multipart(disposition: str, *, folder: str = "", data: bytes = b"hello") -> bytes:
    """A body as a client writes it by hand: the folder field, then one file part."""
    field = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="path"\r\n\r\n{folder}\r\n'
    part = (f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n"
            "Content-Type: application/octet-stream\r\n\r\n")
    return (field + part).encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def _raw_upload(client: Client, body: bytes, content_type: str | None = None):
    return client.post("/storage/upload/", data=body,
                       content_type=content_type or f"multipart/form-data; boundary={BOUNDARY}", headers=JSON)


@pytest.mark.parametrize("encoding, value, words", [
    ("zzz", "%ff.txt", "Invalid encoding 'zzz'"),  # a charset Python does not know
    ("mbcs", "a.txt", "Invalid encoding 'mbcs'"),  # Windows only
    ("idna", "a.txt", "idna"),  # a codec that refuses errors="replace"
    ("undefined", "a.txt", "undefined"),  # a codec that refuses everything
    ("punycode", "%ff.txt", "can't decode byte 0xff"),  # bytes the codec cannot decode
])
def test_it_answers_400_naming_the_file_field_for_an_undecodable_file_name(client, alice, encoding, value,
                                                                           words) -> None:
    client.force_login(alice)
    body = _multipart(f"form-data; name=\"files\"; filename*={encoding}''{value}", folder=f"/{alice.username}")
    refused = _raw_upload(client, body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error.startswith("the upload could not be read: the field 'files' ")
    assert "filename* cannot be decoded" in error and words in error
    assert "filename*=UTF-8''" in error  # what was expected
    assert storage.backend().list(f"{UPLOAD_STAGING}/{alice.username}") == []


def test_it_refuses_a_file_name_that_decodes_to_no_text(client, alice) -> None:
    """unicode_escape turns "\\ud800" into a lone surrogate, which no disk
    can store: refused as a name, not a crash where the disk is asked."""
    client.force_login(alice)
    body = _multipart("form-data; name=\"files\"; filename*=unicode_escape''%5Cud800.txt", folder=f"/{alice.username}")
    refused = _raw_upload(client, body)
    assert refused.status_code == 400
    assert refused.json()["error"].startswith('the file name "\ufffd.txt" holds characters that are not text')


def test_it_still_takes_an_rfc_2231_utf8_file_name(client, alice) -> None:
    client.force_login(alice)
    body = _multipart("form-data; name=\"files\"; filename*=UTF-8''%e2%82%ac-rates.txt", folder=f"/{alice.username}")
    saved = _raw_upload(client, body)
    assert saved.status_code == 200 and saved.json()["saved"] == [f"/{alice.username}/€-rates.txt"]


# --------------------------------------------------- nodes in the admin


@pytest.fixture
def node():
    """A node as an agent registered it, never given tasks (cordoned, no
    heartbeat), removed afterwards."""
    made = Node.objects.create(name=f"t-admin-edit-{uuid.uuid4().hex[:6]}", address="127.0.0.9",
                               docker_host="unix:///x.sock", cpus=4, memory_mb=4096, schedulable=False,
                               gpus=[{"index": 0, "type": "V100"}], port_start=21000, port_end=21099)
    yield made
    made.delete()


@pytest.fixture
def admin_client(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def _change(client: Client, node: Node, **changes):
    """POSTs the node's admin change form: what it shows now, with `changes`."""
    form = {"address": node.address, "docker_host": node.docker_host, "cpus": node.cpus,
            "memory_mb": node.memory_mb, "gpus": json.dumps(node.gpus), "port_start": node.port_start,
            "port_end": node.port_end, "status": node.status, "drain_mode": node.drain_mode,
            "cordoned_at_0": "", "cordoned_at_1": "", "cordoned_by": node.cordoned_by}
    form.update({key: value for key, value in changes.items() if value is not None})
    return client.post(f"/admin/jobs/node/{node.pk}/change/", form)


def _errors(response) -> dict[str, list[str]]:
    assert response.status_code == 200, "the form was expected back, with errors"
    return response.context["adminform"].form.errors


def _pages_work(admin_client: Client, user) -> None:
    """What broke after a bad edit: the admin's list, the Nodes page, and
    the Submit page for every user."""
    assert admin_client.get("/admin/jobs/node/").status_code == 200
    assert admin_client.get("/nodes/").status_code == 200
    as_user = Client()
    as_user.force_login(user)
    assert as_user.get("/submit/").status_code == 200


@pytest.mark.parametrize("gpus, words", [
    ("[1]", "GPU 1 of the list: expected {\"index\""),
    ('{"type": "V100"}', "gpus must be a list of GPUs"),
    ('"V100"', "gpus must be a list of GPUs"),
    ('[{"x": 1}]', "with just those keys"),
    ('[{"index": 0, "type": "V100", "extra": 1}]', "with just those keys"),
    ('[{"index": "0", "type": "V100"}]', "\"index\" must be the GPU's number"),
    ('[{"index": -1, "type": "V100"}]', "\"index\" must be the GPU's number"),
    ('[{"index": true, "type": "V100"}]', "\"index\" must be the GPU's number"),
    ('[{"index": 0, "type": "V100"}, {"index": 0, "type": "V100"}]', "GPU 2 of the list: \"index\" 0 is listed twice"),
    ('[{"index": 0, "type": 100}]', "\"type\" must be a GPU type"),
    ('[{"index": 0, "type": ""}]', "\"type\" must be a GPU type"),
    ('[{"index": 0, "type": "V 100"}]', "\"type\" must be a GPU type"),
])
def test_the_admin_refuses_gpus_no_agent_would_register(admin_client, alice, node, gpus, words) -> None:
    errors = _errors(_change(admin_client, node, gpus=gpus))
    assert list(errors) == ["gpus"] and words in errors["gpus"][0]
    node.refresh_from_db()
    assert node.gpus == [{"index": 0, "type": "V100"}]
    _pages_work(admin_client, alice)


@pytest.mark.parametrize("start, end, field, words", [
    (30000, 100, "port_end", "port_end must be a port from 1024 to 65535 (as node_agent --ports takes), not 100"),
    (30000, 20000, "port_end", "port_end must be at or after port_start (30000), not 20000: the range 30000-20000 "
                               "holds no port"),
    (21000, 70000, "port_end", "port_end must be a port from 1024 to 65535"),
    (0, 21099, "port_start", "port_start must be a port from 1024 to 65535"),
])
def test_the_admin_refuses_a_port_range_no_task_could_use(admin_client, alice, node, start, end, field,
                                                          words) -> None:
    errors = _errors(_change(admin_client, node, port_start=start, port_end=end))
    assert list(errors) == [field] and words in errors[field][0]
    node.refresh_from_db()
    assert (node.port_start, node.port_end) == (21000, 21099)
    _pages_work(admin_client, alice)


def test_the_admin_refuses_an_address_that_is_the_portals_own(admin_client, node) -> None:
    errors = _errors(_change(admin_client, node, address="localhost"))
    assert list(errors) == ["address"] and "one of the portal's own host names" in errors["address"][0]
    node.refresh_from_db()
    assert node.address == "127.0.0.9"


def test_the_admin_saves_good_values_and_keeps_the_node_name(admin_client, alice, node) -> None:
    gpus = [{"index": 0, "type": "A100"}, {"index": 1, "type": "A100-80GB"}]
    saved = _change(admin_client, node, gpus=json.dumps(gpus), port_start=22000, port_end=22000, name="renamed")
    assert saved.status_code == 302, saved.context and saved.context["adminform"].form.errors
    old_name = node.name
    node.refresh_from_db()
    assert (node.gpus, node.port_start, node.port_end, node.name) == (gpus, 22000, 22000, old_name)
    assert node.gpu_types == ["A100", "A100-80GB"]
    _pages_work(admin_client, alice)
    for empty in ("", "null"):  # the box left empty, or JSON's null: no GPUs, never a null no reader expects
        assert _change(admin_client, node, gpus=empty).status_code == 302
        node.refresh_from_db()
        assert node.gpus == []
    _pages_work(admin_client, alice)


@pytest.mark.parametrize("gpu_type", ["V 100", "", "x" * 65, "V100;rm"])
def test_an_agent_refuses_a_simulated_gpu_type_no_job_could_name(gpu_type) -> None:
    # The same rule as the admin's: GPUs of such a type could never be asked for.
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--gpu-type"):
        call_command("node_agent", "--name", f"gpu-type-{uuid.uuid4().hex[:6]}", "--gpus", "1", "--gpu-type", gpu_type)
    assert not Node.objects.filter(name__startswith="gpu-type-").exists()


def test_an_upgrade_cordons_old_rows_no_page_could_read(admin_client, alice) -> None:
    """Rows written before the admin checked them (migration 0018): an
    unreadable `gpus` becomes [] and an unusable port range is kept; both
    rows are cordoned, saying why, and every page reads them again."""
    import importlib

    migration = importlib.import_module("jobs.migrations.0018_cordon_unreadable_node_rows")
    made = {kind: Node.objects.create(name=f"t-old-{kind}-{uuid.uuid4().hex[:6]}", address="127.0.0.9",
                                      docker_host="unix:///x.sock", **{"port_start": 21000, "port_end": 21099, **values})
            for kind, values in {"gpus": {"gpus": [1, {"type": "V100"}]},
                                 "ports": {"gpus": [{"index": 0, "type": "V100"}], "port_end": 100},
                                 "good": {"gpus": [{"index": 0, "type": "V100"}]}}.items()}
    try:
        assert migration.cordon_unreadable(Node) == 2
        for row in made.values():
            row.refresh_from_db()
        assert made["gpus"].gpus == [] and not made["gpus"].schedulable
        assert made["gpus"].cordoned_by == "migration 0018: gpus unreadable, set to []"
        assert made["ports"].gpus == [{"index": 0, "type": "V100"}] and not made["ports"].schedulable
        assert made["ports"].cordoned_by == "migration 0018: port range 21000-100 unusable"
        assert made["good"].schedulable and made["good"].cordoned_by == ""
        _pages_work(admin_client, alice)
        assert migration.cordon_unreadable(Node) == 1  # the port range is the admin's to fix; the rest is done
    finally:
        for row in made.values():
            row.delete()


@pytest.mark.parametrize("gpus", [
    [], [{"index": 0, "type": "V100"}, {"index": 1, "type": "A100-80G"}], [{"index": 0, "type": "V100"}] * 2,
    [{"index": True, "type": "V100"}], [{"index": -1, "type": "V100"}], [{"index": 0, "type": "V 100"}],
    [{"index": 0, "type": "x" * 65}], [{"index": 0}], [{"index": 0, "type": "V100", "extra": 1}], {"0": "V100"},
    "V100", None, [1],
])
def test_migration_0018_judged_gpus_as_the_admins_checks_do(gpus) -> None:
    """0018 carries its own copy of the checks of its day, so that a later
    change to them cannot change it; today they still agree."""
    import importlib

    from django.core.exceptions import ValidationError

    from jobs.models import validate_node_gpus

    migration = importlib.import_module("jobs.migrations.0018_cordon_unreadable_node_rows")
    try:
        validate_node_gpus(gpus)
        readable = True
    except ValidationError:
        readable = False
    assert migration.gpus_readable(gpus) is readable


@pytest.mark.parametrize("ports", [(21000, 21099), (21000, 21000), (21000, 100), (80, 2000), (1024, 65535),
                                   (2000, 70000), (None, None), (None, 3000)])
def test_migration_0018_judged_port_ranges_as_the_admins_checks_do(ports) -> None:
    import importlib

    from jobs.models import node_port_range_errors

    migration = importlib.import_module("jobs.migrations.0018_cordon_unreadable_node_rows")
    assert migration.port_range_usable(*ports) is (not node_port_range_errors(*ports))
