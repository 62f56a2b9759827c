"""An install's database upgrades with nothing it holds lost or changed.

A database is filled through the historical models as a portal of that time
would have filled it (users, virtual clusters, nodes, jobs in every state
with v1 JSON and v2 YAML configs, attempts, task attempts, logs, tokens ...):
first at 0001, then at 0010, once every table exists. It is then migrated to
the latest migration, and every row and column stored before must read back
the same, except what a data migration says it changes (0018's repair of
unreadable node rows), which is checked on its own. Going back to 0010 and
up again must keep everything too.

The upgrade runs on an empty database of the test's own (a SQLite file, or
a PostgreSQL database beside the run's), put in place of the default
connection while it runs. The session's database is shared with the
gunicorn and node agents other tests start and must never go back to 0001;
and pytest-django's `django_db` mark is not used because here it moves every
later test of the session onto its own test database (TEST NAME in
portal/settings.py) that those processes do not see.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.apps.registry import Apps
from django.contrib.auth.hashers import make_password
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor
from django.db.utils import load_backend

from jobs.spec import JobSpec, parse_config_text

FIRST = [("jobs", "0001_initial")]
# Every table exists from here on; later migrations index, repair and add
# columns (0020's exit triggers).
ALL_TABLES = [("jobs", "0010_image_pulls")]
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 11, 20, 8, 30, 15, 123456, tzinfo=UTC)

Rows = dict[str, dict[Any, dict[str, Any]]]  # model label -> pk -> column -> value


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


# ------------------------------------------------- a database of the test's own

@contextmanager
def private_database(tmp_path: Path) -> Iterator[BaseDatabaseWrapper]:
    """An empty database on the session's engine, made the default
    connection while the block runs (a data migration that uses the default
    manager, as 0018 does, must reach it too), then removed."""
    shared = connections[DEFAULT_DB_ALIAS]
    postgres = shared.vendor == "postgresql"
    name = f"{shared.settings_dict['NAME']}_upgrade" if postgres else str(tmp_path / "upgrade.sqlite3")
    if postgres:
        _postgres_database(shared, name, create=True)
    settings_dict = {**shared.settings_dict, "NAME": name}
    private = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, DEFAULT_DB_ALIAS)
    connections[DEFAULT_DB_ALIAS] = private
    try:
        yield private
    finally:
        connections[DEFAULT_DB_ALIAS] = shared
        private.close()
        if postgres:
            _postgres_database(shared, name, create=False)


def _postgres_database(shared: BaseDatabaseWrapper, name: str, *, create: bool) -> None:
    quoted = shared.ops.quote_name(name)
    with shared.cursor() as cursor:  # autocommit: CREATE DATABASE may not run in a transaction
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
        if create:
            cursor.execute(f"CREATE DATABASE {quoted}")


def migrate(connection: BaseDatabaseWrapper, targets: list[tuple[str, str]] | None = None) -> Apps:
    """Migrate to `targets` (the latest of every app when None); the
    historical models at that point."""
    executor = MigrationExecutor(connection)
    targets = targets or executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    executor.loader.build_graph()  # it now knows what was applied
    return executor.loader.project_state(targets).apps


# ------------------------------------------------- what an install held at 0001

V1_CONFIG = """// Trains on CIFAR-10; the comments are part of what was submitted.
{
  "jobName": "cifar10_resnet",
  "image": "tensorflow/tensorflow:1.12.0-gpu-py3",
  /* two workers */
  "taskRoles": [
    {"name": "worker", "taskNumber": 2, "cpuNumber": 4, "memoryMB": 8192, "gpuNumber": 1,
     "command": "python train.py --steps=1000 --note='naïve ✓'"}
  ],
  "retryCount": 2
}
"""

V2_CONFIG = """# A parameter server and a worker.
protocolVersion: 2
name: bert_12_layers
type: job
parameters:
  model: bert-base
taskRoles:
  ps:
    instances: 1
    dockerImage: image
    resourcePerInstance: {cpu: 1, memoryMB: 1024, gpu: 0, ports: {http: 1}}
    commands:
      - echo ps <% $parameters.model %>
  worker:
    instances: 1
    dockerImage: image
    resourcePerInstance: {cpu: 2, memoryMB: 4096, gpu: 2}
    commands:
      - python run.py --model <% $parameters.model %>
prerequisites:
  - {name: image, type: dockerimage, uri: "pytorch/pytorch:2.1.0-cuda12.1-cudnn8-runtime"}
"""


def parsed(text: str) -> tuple[str, dict[str, Any]]:
    """The stored text and normalized config of a submission, as the portal
    keeps them."""
    result = parse_config_text(text, user_name="alice", default_fs_uri="file://")
    return result.raw, result.spec.to_config()


@dataclasses.dataclass
class Filled:
    """Ids of the rows the checks look at by name."""

    users: dict[str, int] = dataclasses.field(default_factory=dict)
    nodes: dict[str, int] = dataclasses.field(default_factory=dict)
    jobs: dict[str, int] = dataclasses.field(default_factory=dict)
    task_attempts: list[int] = dataclasses.field(default_factory=list)


def fill_people(apps: Apps, filled: Filled) -> None:
    User, VirtualCluster = apps.get_model("jobs", "User"), apps.get_model("jobs", "VirtualCluster")
    for name, admin in (("alice", False), ("bob", False), ("root_admin", True)):
        user = User.objects.create(username=name, password=make_password(f"{name}-pw"), email=f"{name}@example.org",
                                   first_name="Zoë" if name == "alice" else "", is_staff=admin, is_superuser=admin,
                                   date_joined=at(-600), last_login=at(-5))
        filled.users[name] = user.pk
    VirtualCluster.objects.create(name="default", open_to_all=True, description="Everyone's")
    research = VirtualCluster.objects.create(name="research", capacity=33.3, description="Lab A — GPUs")
    research.users.set([filled.users["alice"], filled.users["bob"]])
    alice = filled.users["alice"]
    apps.get_model("jobs", "ApiToken").objects.create(
        user_id=alice, key_hash="a" * 64, prefix="pai_abcd1234", label="CI", created_at=at(-100),
        expires_at=at(60 * 24 * 90), last_used_at=at(-1))
    apps.get_model("jobs", "SshKey").objects.create(
        user_id=alice, title="laptop", public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOk alice@laptop",
        fingerprint="SHA256:6Jp4Yq", created_at=at(-90))


# name -> (gpus, port_start, port_end, schedulable)
NODES: dict[str, tuple[Any, int, int, bool]] = {
    "gpu-1": ([{"index": 0, "type": "V100"}, {"index": 1, "type": "V100"}], 20000, 20999, True),
    "cpu-unticked": ([], 21000, 21999, False),  # an admin unticked it: 0018 must leave it as it is
    "bad-gpus": ({"0": "V100"}, 22000, 22999, True),
    "bad-ports": ([{"index": 0, "type": "T4"}], 30000, 29999, True),
    "bad-both": ([{"index": 0}], 80, 90, True),
}


def fill_nodes(apps: Apps, filled: Filled) -> None:
    Node = apps.get_model("jobs", "Node")
    for name, (gpus, start, end, schedulable) in NODES.items():
        node = Node.objects.create(
            name=name, address=f"10.0.0.{len(filled.nodes) + 1}", docker_host="unix:///var/run/docker.sock",
            engine_id=f"ENGINE:{name}", cpus=32, memory_mb=256000, gpus=gpus, port_start=start, port_end=end,
            schedulable=schedulable, last_heartbeat=at(-1), agent_pid=4242, agent_host=f"{name}.lab")
        filled.nodes[name] = node.pk


def new_job(apps: Apps, filled: Filled, *, name: str, owner: str, text: str, state: str, vc: str = "default",
            **values: Any) -> Any:
    raw, config = parsed(text)
    job = apps.get_model("jobs", "Job").objects.create(
        owner_id=filled.users[owner], name=name, state=state, config_raw=raw, config=config,
        virtual_cluster=apps.get_model("jobs", "VirtualCluster").objects.get(name=vc),
        warnings=[{"path": "retryCount", "message": "over the usual"}], submitted_at=at(len(filled.jobs)),
        total_tasks=2, total_gpus=2, total_roles=1 if text == V1_CONFIG else 2, **values)
    filled.jobs[name] = job.pk
    return job


def new_attempts(apps: Apps, job: Any, states: list[str]) -> list[Any]:
    JobAttempt = apps.get_model("jobs", "JobAttempt")
    return [JobAttempt.objects.create(job=job, number=number, state=state, created_at=at(number),
                                      subnet=f"10.150.{job.pk}.{number * 16}/28" if state != "WAITING" else "",
                                      exit_type="USER_EXIT" if state == "FAILED" else "")
            for number, state in enumerate(states, start=1)]


def new_task_attempt(apps: Apps, filled: Filled, attempt: Any, task: Any, *, node: str, state: str,
                     **values: Any) -> Any:
    task_attempt = apps.get_model("jobs", "TaskAttempt").objects.create(
        job_id=attempt.job_id, job_attempt=attempt, task=task, number=attempt.number, state=state,
        node_id=filled.nodes[node], node_name=node, host_ip="10.0.0.1", ip=f"10.150.0.{len(filled.task_attempts)}",
        cpus=4, memory_mb=8192, gpus=[0], gpu_type="V100", ports={"http": [20000 + len(filled.task_attempts)]},
        container_id=f"{len(filled.task_attempts):064x}", assigned_at=at(2), launched_at=at(3), started_at=at(4),
        ssh_available=True, last_activity_at=at(5), **values)
    filled.task_attempts.append(task_attempt.pk)
    return task_attempt


LOG_TEXTS = ["epoch 1 loss=0.25 ✓ 训练", "", "  indented\tand tabbed  ", "\x1b[31mred\x1b[0m", "x" * 10_000]


def new_logs(apps: Apps, task_attempt: Any) -> None:
    LogLine, LogCursor = apps.get_model("jobs", "LogLine"), apps.get_model("jobs", "LogCursor")
    for stream in (1, 2, 3):
        LogLine.objects.bulk_create([LogLine(attempt=task_attempt, stream=stream, seq=seq, text=text)
                                     for seq, text in enumerate(LOG_TEXTS)])
        LogCursor.objects.create(attempt=task_attempt, stream=stream, next_seq=len(LOG_TEXTS),
                                 last_ts_ns=1_795_000_000_123_456_789, count_at_ts=2, bytes_stored=10_100,
                                 truncated=stream == 3)


def fill_finished_job(apps: Apps, filled: Filled) -> None:
    """A v1 job that failed twice and succeeded on its third attempt."""
    job = new_job(apps, filled, name="cifar10_resnet", owner="alice", text=V1_CONFIG, state="SUCCEEDED",
                  vc="research", started_at=at(10), finished_at=at(70), retry_limit=2, attempt_number=3,
                  exit_type="SUCCEEDED", exit_code=0, gpu_type="V100", ssh_public_key="ssh-rsa AAAA job",
                  ssh_private_key="-----BEGIN OPENSSH PRIVATE KEY-----\nsealed\n", upload_outputs=True)
    tasks = [apps.get_model("jobs", "Task").objects.create(job=job, role="worker", index=index) for index in (0, 1)]
    attempts = new_attempts(apps, job, ["FAILED", "FAILED", "SUCCEEDED"])
    for attempt in attempts:
        for task in tasks:
            state = "SUCCEEDED" if attempt.state == "SUCCEEDED" else "FAILED"
            task_attempt = new_task_attempt(apps, filled, attempt, task, node="gpu-1", state=state,
                                            exit_code=0 if state == "SUCCEEDED" else 137, finished_at=at(70),
                                            exit_type="SUCCEEDED" if state == "SUCCEEDED" else "OOM",
                                            exit_reason="" if state == "SUCCEEDED" else "out of memory (8192 MB)")
            new_logs(apps, task_attempt)


def fill_running_job(apps: Apps, filled: Filled) -> None:
    """A v2 job running on gpu-1, holding GPUs and ports, with a terminal open."""
    job = new_job(apps, filled, name="bert_12_layers", owner="alice", text=V2_CONFIG, state="RUNNING",
                  started_at=at(20), attempt_number=1)
    attempt = new_attempts(apps, job, ["RUNNING"])[0]
    for role in ("ps", "worker"):
        task = apps.get_model("jobs", "Task").objects.create(job=job, role=role, index=0)
        task_attempt = new_task_attempt(apps, filled, attempt, task, node="gpu-1", state="RUNNING")
        new_logs(apps, task_attempt)
    held = apps.get_model("jobs", "TaskAttempt").objects.get(pk=filled.task_attempts[-1])
    node_id = filled.nodes["gpu-1"]
    apps.get_model("jobs", "GpuAllocation").objects.create(node_id=node_id, index=0, attempt=held)
    apps.get_model("jobs", "PortAllocation").objects.create(node_id=node_id, address="10.0.0.1", port=20011,
                                                            attempt=held)
    apps.get_model("jobs", "TerminalSession").objects.create(user_id=filled.users["alice"], attempt=held,
                                                             started_at=at(25), client_address="192.0.2.7")


def fill_other_jobs(apps: Apps, filled: Filled) -> None:
    """Waiting, stopping and stopped jobs, and bob's job named like alice's."""
    waiting = new_job(apps, filled, name="queued_sweep", owner="bob", text=V1_CONFIG, state="WAITING", vc="research",
                      waiting_reason="waiting for 2 GPUs (V100) in research", overtaken=3)
    new_attempts(apps, waiting, ["WAITING"])
    admin = filled.users["root_admin"]
    for name, state in (("long_stop", "STOPPING"), ("stopped_by_admin", "STOPPED")):
        job = new_job(apps, filled, name=name, owner="bob", text=V2_CONFIG, state=state, started_at=at(30),
                      stop_requested_at=at(40), stop_requested_by_id=admin,
                      **({"finished_at": at(41), "exit_type": "USER_STOP"} if state == "STOPPED" else {}))
        new_attempts(apps, job, ["STOPPED" if state == "STOPPED" else "STOPPING"])
    new_job(apps, filled, name="cifar10_resnet_bob", owner="bob", text=V1_CONFIG, state="FAILED",
            exit_type="PLATFORM", exit_reason="image pull failed: manifest unknown")


def fill_at_first(apps: Apps) -> Filled:
    filled = Filled()
    fill_people(apps, filled)
    fill_nodes(apps, filled)
    fill_finished_job(apps, filled)
    fill_running_job(apps, filled)
    fill_other_jobs(apps, filled)
    return filled


# ------------------------------------- what the tables added by 0003..0010 held

def fill_limits_and_tags(apps: Apps, filled: Filled) -> None:
    research = apps.get_model("jobs", "VirtualCluster").objects.get(name="research")
    UserLimit = apps.get_model("jobs", "UserLimit")
    UserLimit.objects.create(virtual_cluster=research, max_waiting_jobs=10, max_running_jobs=2, max_gpus=8)
    UserLimit.objects.create(virtual_cluster=research, user_id=filled.users["bob"], max_gpus=2)
    JobTag = apps.get_model("jobs", "JobTag")
    for value in ("nlp", "größe", "bert"):
        JobTag.objects.create(job_id=filled.jobs["bert_12_layers"], value=value)
    JobTag.objects.create(job_id=filled.jobs["queued_sweep"], value="nlp")
    apps.get_model("jobs", "Job").objects.filter(pk=filled.jobs["bert_12_layers"]).update(
        secrets_sealed="gAAAAABsealed-secrets-token==")


def fill_notifications(apps: Apps, filled: Filled) -> None:
    alice = filled.users["alice"]
    apps.get_model("jobs", "NotificationSettings").objects.create(
        user_id=alice, webhook_url="https://hooks.example.org/pai?team=a&x=1", webhook_secret_sealed="gAAAAABwebhook==",
        email_states=["FAILED", "SUCCEEDED"])
    Delivery = apps.get_model("jobs", "NotificationDelivery")
    payload = {"job": "alice~cifar10_resnet", "state": "SUCCEEDED", "exitCode": 0, "tags": ["nlp"], "ratio": 0.5}
    for status, tries in (("DELIVERED", 1), ("RETRYING", 3), ("FAILED", 8)):
        Delivery.objects.create(user_id=alice, job_id=filled.jobs["cifar10_resnet"], channel="webhook",
                                payload=payload, target="https://hooks.example.org/pai", status=status, tries=tries,
                                response_code=200 if status == "DELIVERED" else 502, result=f"{status}: HTTP",
                                created_at=at(71), last_try_at=at(72), next_try_at=at(80))
    Delivery.objects.create(user_id=alice, job=None, channel="email", payload=payload, target="alice@example.org",
                            status="PENDING")


def fill_nodes_later(apps: Apps, filled: Filled) -> None:
    """A join token, an admin's cordon and drain, a job that ended by them,
    and an image being pulled."""
    apps.get_model("jobs", "NodeJoinToken").objects.create(
        key_hash="b" * 64, prefix="join_abcdef01", label="rack 4", expires_at=at(60 * 24), uses=3,
        created_by_id=filled.users["root_admin"], last_used_at=at(-2), last_used_from="203.0.113.9")
    apps.get_model("jobs", "Node").objects.filter(name="cpu-unticked").update(
        cordoned_at=at(-30), cordoned_by="root_admin", drain_mode="wait", engine_marker="marker-1")
    job = new_job(apps, filled, name="drained_then_idle", owner="alice", text=V1_CONFIG, state="FAILED",
                  exit_type="IDLE_GPUS", finished_at=at(90))
    attempt = new_attempts(apps, job, ["FAILED"])[0]
    attempt.exit_type = "NODE_DRAINED"
    attempt.save(update_fields=["exit_type"])
    task = apps.get_model("jobs", "Task").objects.create(job=job, role="worker", index=0)
    task_attempt = new_task_attempt(apps, filled, attempt, task, node="cpu-unticked", state="STOPPED",
                                    stop_reason="NODE_DRAINED")
    apps.get_model("jobs", "ImagePull").objects.create(
        attempt=task_attempt, node_id=filled.nodes["cpu-unticked"], image="pytorch/pytorch:2.1.0", state="PULLING",
        layers_done=3, layers_total=11, bytes_done=3_500_000_000, bytes_total=7_500_000_000, sizes_pending=2)


def fill_usage(apps: Apps, filled: Filled) -> None:
    running = apps.get_model("jobs", "TaskAttempt").objects.get(pk=filled.task_attempts[-1])
    TaskUsage = apps.get_model("jobs", "TaskUsage")
    for minute, averaged in ((21, True), (22, False)):
        TaskUsage.objects.create(attempt=running, at=at(minute), averaged=averaged, cpu_percent=187.5,
                                 memory_bytes=6_442_450_944, network_rx_bytes=12_000_000_000, block_write_bytes=1,
                                 gpus=[{"index": 0, "utilization": 3.5, "memoryUsedMB": 15000}])
    apps.get_model("jobs", "IdleGpus").objects.create(attempt=running, since=at(21), flagged_at=at(50))


def fill_at_all_tables(apps: Apps, filled: Filled) -> None:
    fill_limits_and_tags(apps, filled)
    fill_notifications(apps, filled)
    fill_nodes_later(apps, filled)
    fill_usage(apps, filled)


# ---------------------------------------------------------------- what was kept

def snapshot(apps: Apps) -> Rows:
    """Every row of the portal's tables (many-to-many ones included), by model and pk."""
    rows: Rows = {}
    for model in apps.get_app_config("jobs").get_models(include_auto_created=True):
        pk = model._meta.pk.attname
        rows[model._meta.label_lower] = {row[pk]: row for row in model.objects.order_by(pk).values()}
    return rows


def changes(before: Rows, after: Rows) -> list[str]:
    """Each row or value of `before` that `after` lost or holds otherwise."""
    found = []
    for label, rows in before.items():
        for pk, row in rows.items():
            now = after.get(label, {}).get(pk)
            if now is None:
                found.append(f"{label} {pk}: lost")
                continue
            found += [f"{label} {pk}.{column}: {value!r} -> {now.get(column)!r}"
                      for column, value in row.items() if now.get(column) != value]
    return found


# Made from the samples by 0025 (the roll-up's marks of their minutes; its
# rows, made by the roll-up): gone below it, made again on the way up.
ROLLUP = {"jobs.usageminutemark", "jobs.jobusageminute"}


def kept(rows: Rows) -> Rows:
    """The rows that must survive a way back below 0025."""
    return {label: found for label, found in rows.items() if label not in ROLLUP}


def assert_sample_minutes_marked(apps: Apps, filled: Filled) -> None:
    """0025 marks each job attempt's minute of the stored samples, once."""
    running = apps.get_model("jobs", "TaskAttempt").objects.get(pk=filled.task_attempts[-1])
    minutes = {int(at(m).timestamp()) // 60 for m in (21, 22)}
    marks = apps.get_model("jobs", "UsageMinuteMark").objects.values_list("job_id", "number", "minute", "stamp")
    assert sorted(marks) == sorted((running.job_id, running.number, minute, 0) for minute in minutes)
    assert not apps.get_model("jobs", "JobUsageMinute").objects.exists()  # the roll-up's to write


# 0018's repairs: (gpus after, what cordoned_by names).
REPAIRED = {
    "bad-gpus": ([], "migration 0018: gpus unreadable, set to []"),
    "bad-ports": (NODES["bad-ports"][0], "migration 0018: port range 30000-29999 unusable"),
    "bad-both": ([], "migration 0018: gpus unreadable, set to []; port range 80-90 unusable"),
}
REPAIRED_COLUMNS = {"gpus", "schedulable", "cordoned_at", "cordoned_by"}


def without_repairs(changed: list[str], filled: Filled, columns: set[str] = REPAIRED_COLUMNS) -> list[str]:
    """`changed` less the `columns` of the node rows 0018 repairs."""
    repaired = {f"jobs.node {filled.nodes[name]}.{column}:" for name in REPAIRED for column in columns}
    return [change for change in changed if not any(change.startswith(prefix) for prefix in repaired)]


def assert_added_columns_empty(apps: Apps) -> None:
    """The rows stored before 0004 and 0006 hold their new columns' defaults:
    no secrets, no cordon, no drain."""
    assert set(apps.get_model("jobs", "Job").objects.values_list("secrets_sealed", flat=True)) == {""}
    nodes = apps.get_model("jobs", "Node").objects.values_list("cordoned_at", "cordoned_by", "drain_mode",
                                                               "engine_marker")
    assert set(nodes) == {(None, "", "", "")}


def assert_exit_triggers_unknown(apps: Apps) -> None:
    """Jobs and attempts that ended before 0020 name no trigger: which task
    ended them was not recorded, and 0020 does not guess it."""
    for model in ("Job", "JobAttempt"):
        rows = apps.get_model("jobs", model).objects
        assert rows.filter(state__in=["SUCCEEDED", "FAILED", "STOPPED"]).exists(), model
        assert set(rows.values_list("exit_trigger_message", "exit_trigger_role", "exit_trigger_index")) == {
            (None, None, None)}, model


def assert_nodes_repaired(apps: Apps, filled: Filled) -> None:
    Node = apps.get_model("jobs", "Node")
    for name, (gpus, cordoned_by) in REPAIRED.items():
        node = Node.objects.get(pk=filled.nodes[name])
        assert (node.gpus, node.schedulable, node.cordoned_by) == (gpus, False, cordoned_by), name
        assert node.cordoned_at is not None, name
        assert (node.port_start, node.port_end) == NODES[name][1:3], name  # kept for the admin to see


def assert_configs_readable(apps: Apps, filled: Filled) -> None:
    """The stored configs still read as the jobs they were."""
    Job = apps.get_model("jobs", "Job")
    v1, v2 = Job.objects.get(pk=filled.jobs["cifar10_resnet"]), Job.objects.get(pk=filled.jobs["bert_12_layers"])
    assert v1.config_raw == V1_CONFIG  # comments and all
    assert "protocolVersion: 2" in v2.config_raw and "<% $parameters.model %>" in v2.config_raw
    assert [(r.name, r.task_number) for r in JobSpec.from_config(v1.config).task_roles] == [("worker", 2)]
    assert [r.name for r in JobSpec.from_config(v2.config).task_roles] == ["ps", "worker"]


def name_search(connection: BaseDatabaseWrapper, piece: str) -> list[int]:
    """Jobs whose name holds `piece`, by 0015's SQLite index."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT rowid FROM jobs_job_name_fts WHERE jobs_job_name_fts MATCH %s ORDER BY rowid",
                       [f'"{piece}"'])
        return [row[0] for row in cursor.fetchall()]


def assert_names_searchable(connection: BaseDatabaseWrapper, filled: Filled) -> None:
    if connection.vendor != "sqlite":
        return  # PostgreSQL's trigram index is an ordinary expression index over the table
    assert name_search(connection, "resnet") == sorted([filled.jobs["cifar10_resnet"],
                                                        filled.jobs["cifar10_resnet_bob"]])
    assert name_search(connection, "bert_12") == [filled.jobs["bert_12_layers"]]


# -------------------------------------------------------------------- the tests

def test_it_upgrades_a_filled_database_from_0001_keeping_every_row(tmp_path: Path) -> None:
    with private_database(tmp_path) as connection:
        apps = migrate(connection, FIRST)
        filled = fill_at_first(apps)
        at_first = snapshot(apps)

        apps = migrate(connection, ALL_TABLES)
        assert changes(at_first, snapshot(apps)) == []
        assert_added_columns_empty(apps)
        fill_at_all_tables(apps, filled)
        before = snapshot(apps)

        latest = migrate(connection)
        assert without_repairs(changes(before, snapshot(latest)), filled) == []
        assert_sample_minutes_marked(latest, filled)
        assert_exit_triggers_unknown(latest)
        assert_nodes_repaired(latest, filled)
        assert_configs_readable(latest, filled)
        assert_names_searchable(connection, filled)


def test_it_goes_back_to_0010_and_up_again_keeping_every_row(tmp_path: Path) -> None:
    with private_database(tmp_path) as connection:
        filled = fill_at_first(migrate(connection, FIRST))
        fill_at_all_tables(migrate(connection, ALL_TABLES), filled)
        upgraded = snapshot(migrate(connection))

        assert changes(kept(upgraded), snapshot(migrate(connection, ALL_TABLES))) == []
        latest = migrate(connection)
        # 0018 runs again on the way up and stamps its cordons anew (see the
        # xfail test below); nothing else may change.
        assert without_repairs(changes(kept(upgraded), snapshot(latest)), filled, {"cordoned_at", "cordoned_by"}) == []
        assert_sample_minutes_marked(latest, filled)
        assert_names_searchable(connection, filled)
        # The name index follows jobs stored after the way back and up.
        job = latest.get_model("jobs", "Job").objects.get(pk=filled.jobs["queued_sweep"])
        job.name = "queued_sweep_renamed"
        job.save(update_fields=["name"])
        assert connection.vendor != "sqlite" or name_search(connection, "renamed") == [job.pk]


# An admin who cordoned a node before the upgrade stays named, with the
# time of the cordon, as node_cordon never re-stamps a cordon in place; the
# problems 0018 found are added after the name, once however often it runs.
def test_it_keeps_an_admins_cordon_of_a_node_0018_repairs(tmp_path: Path) -> None:
    with private_database(tmp_path) as connection:
        before_0018 = [("jobs", "0017_job_task_attempt_fk_without_own_index")]
        apps = migrate(connection, before_0018)
        fill_nodes(apps, Filled())
        apps.get_model("jobs", "Node").objects.filter(name="bad-gpus").update(
            schedulable=False, cordoned_at=at(-30), cordoned_by="root_admin")

        node = migrate(connection).get_model("jobs", "Node").objects.get(name="bad-gpus")
        assert node.gpus == [] and node.schedulable is False
        assert node.cordoned_at == at(-30)
        assert node.cordoned_by == "root_admin (migration 0018: gpus unreadable, set to [])"
        # Back below 0018 and up again: nothing more to repair, nothing re-stamped.
        migrate(connection, before_0018)
        node = migrate(connection).get_model("jobs", "Node").objects.get(name="bad-gpus")
        assert (node.cordoned_at, node.cordoned_by) == (at(-30), "root_admin (migration 0018: gpus unreadable, set to [])")


# 0021 makes user names unique whatever their case, in the database. A
# database that already holds such a pair (made before by two requests at
# once) is not changed or guessed at: the upgrade stops naming them.
def test_it_names_the_users_whose_names_differ_only_in_case_and_changes_nothing(tmp_path: Path) -> None:
    with private_database(tmp_path) as connection:
        before_0021 = [("jobs", "0020_job_exit_trigger")]
        users = migrate(connection, before_0021).get_model("jobs", "User").objects
        for name in ("carol", "Carol", "dave"):
            users.create(username=name, password=make_password(None))
        with pytest.raises(RuntimeError, match=r"differ only in case.*: Carol, carol$"):
            migrate(connection)
        users = migrate(connection, before_0021).get_model("jobs", "User").objects
        assert sorted(users.values_list("username", flat=True)) == ["Carol", "carol", "dave"]
        users.filter(username="Carol").update(username="carol_2")
        migrate(connection)
