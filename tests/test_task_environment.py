"""A task's environment variables as the reference names them, from the
pure builder (jobs/environment.py); tests/test_engine.py reads them inside
real containers."""

from __future__ import annotations

import json

from jobs.environment import PeerTask, task_environment
from jobs.spec import parse_job_config

FS = "hdfs://namenode:9000"


def _spec(*roles: dict, **top):
    config = {"jobName": "env-job", "image": "busybox", **top, "taskRoles": [
        {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 512, "gpuNumber": 0, "command": "true", **role}
        for role in roles]}
    return parse_job_config(json.dumps(config), user_name="alice", default_fs_uri=FS).spec


def _env(spec, me: PeerTask, peers: list[PeerTask]) -> dict[str, str]:
    return task_environment(spec=spec, user_name="alice", default_fs_uri=FS, me=me, peers=peers,
                            attempt_number=1, authorized_keys="")


def test_the_ssh_port_is_the_first_one_as_sshd_takes_one():
    spec = _spec({"portList": [{"label": "ssh", "beginAt": 0, "portNumber": 2}]})
    me = PeerTask("main", 0, "10.0.0.1", "e", "", ports={"ssh": [2001, 2002], "main": [2003]})
    env = _env(spec, me, [me])
    assert env["PAI_CONTAINER_SSH_PORT"] == "2001"
    assert env["PAI_CONTAINER_HOST_ssh_PORT_LIST"] == "2001,2002"


def test_a_role_named_like_a_number_leaves_each_roles_list_by_number_its_own():
    spec = _spec({"name": "1"}, {"name": "0"})
    one = PeerTask("1", 0, "10.0.0.1", "e1", "", ports={"ssh": [2001], "main": [2002]})
    zero = PeerTask("0", 0, "10.0.0.2", "e2", "", ports={"ssh": [3001], "main": [3002]})
    env = _env(spec, one, [one, zero])
    # The early reference: PAI_TASK_ROLE_$i_HOST_LIST is role number $i's.
    assert (env["PAI_TASK_ROLE_NO"], env["PAI_TASK_ROLE_0_HOST_LIST"]) == ("0", "10.0.0.1:2002")
    assert env["PAI_TASK_ROLE_1_HOST_LIST"] == "10.0.0.2:3002"


def test_job_envs_numbers_read_as_javascript_writes_them():
    spec = _spec({}, jobEnvs={"STEPS": 1e6, "ONE": 1.0, "RATE": 0.5, "FLAG": True})
    me = PeerTask("main", 0, "10.0.0.1", "e", "", ports={"main": [1]})
    env = _env(spec, me, [me])
    assert (env["STEPS"], env["ONE"], env["RATE"], env["FLAG"]) == ("1000000", "1", "0.5", "true")


def test_each_task_knows_its_index_by_both_of_openpais_names():
    """PAI_TASK_INDEX is what OpenPAI's Kubernetes runtime sets and its
    distributed examples read (torch's node_rank); the reference's name
    stays too."""
    spec = _spec({"taskNumber": 3})
    peers = [PeerTask("main", i, f"10.0.0.{i + 1}", "e", "", ports={}) for i in range(3)]
    for me in peers:
        env = _env(spec, me, peers)
        assert env["PAI_TASK_INDEX"] == env["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == str(me.index)
