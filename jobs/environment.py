"""The environment of a task's container. Pure: no Django, no Docker.

Both generations of the reference are served, so the commands in either
generation's examples run unchanged. The README lists every variable.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from jobs.spec import JobSpec, env_value

# Our extra port: a role that declares no port of its own still gets one,
# so PAI_CURRENT_CONTAINER_PORT and the host lists have something to name.
MAIN_PORT_LABEL = "main"
SSH_PORT_LABEL = "ssh"


@dataclass(frozen=True)
class PeerTask:
    """Where one task of the job runs, as the scheduler placed it."""

    role: str
    index: int
    node_address: str
    engine_id: str
    ip: str  # address on the job's own network ("" for a one-task job)
    ports: dict[str, list[int]] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()


def platform_port_labels(declared: list[str]) -> list[str]:
    """Labels the platform adds to a task role's ports: `ssh` for sshd
    (unless the user declared it), and `main` when no user port exists."""
    extra = []
    if SSH_PORT_LABEL not in declared:
        extra.append(SSH_PORT_LABEL)
    if not [label for label in declared if label != SSH_PORT_LABEL]:
        extra.append(MAIN_PORT_LABEL)
    return extra


def main_port(spec: JobSpec, role_name: str, ports: dict[str, list[int]]) -> int | None:
    """The task's first user port: first port of the first declared label."""
    role = spec.role(role_name)
    for port in role.ports:
        if port.label != SSH_PORT_LABEL and ports.get(port.label):
            return ports[port.label][0]
    if ports.get(MAIN_PORT_LABEL):
        return ports[MAIN_PORT_LABEL][0]
    return None


def peer_address(peer: PeerTask, *, seen_from_engine: str) -> str:
    """How a container on `seen_from_engine` reaches `peer`.

    On the same Docker engine the job network's address works (ports listen
    inside the container); across engines only the node's published ports do.
    """
    if peer.ip and peer.engine_id == seen_from_engine:
        return peer.ip
    return peer.node_address


def task_environment(
    *,
    spec: JobSpec,
    user_name: str,
    default_fs_uri: str,
    me: PeerTask,
    peers: list[PeerTask],
    attempt_number: int,
    authorized_keys: str,
) -> dict[str, str]:
    env: dict[str, str] = {key: env_value(value) for key, value in spec.job_envs.items()}
    roles = spec.task_roles
    role_names = [r.name for r in roles]
    my_role = spec.role(me.role)
    by_role: dict[str, list[PeerTask]] = {name: [] for name in role_names}
    for peer in sorted(peers, key=lambda p: (role_names.index(p.role), p.index)):
        by_role[peer.role].append(peer)

    def addr(peer: PeerTask) -> str:
        return peer_address(peer, seen_from_engine=me.engine_id)

    def host_list(role_name: str) -> str:
        entries = []
        for peer in by_role[role_name]:
            port = main_port(spec, role_name, peer.ports)
            entries.append(f"{addr(peer)}:{port}" if port else addr(peer))
        return ",".join(entries)

    env.update({
        "PAI_JOB_NAME": spec.job_name,
        "PAI_USER_NAME": user_name,
        "PAI_DEFAULT_FS_URI": default_fs_uri,
        "PAI_DATA_DIR": spec.data_dir or "",
        "PAI_OUTPUT_DIR": spec.output_dir,
        "PAI_CODE_DIR": spec.code_dir or "",
        "PAI_JOB_ATTEMPT": str(attempt_number),
        "PAI_TASK_ROLE_COUNT": str(len(roles)),
        "PAI_TASK_ROLE_LIST": ",".join(role_names),
        "PAI_CURRENT_TASK_ROLE_NAME": me.role,
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(me.index),
        # OpenPAI's Kubernetes runtime's name for the same index, which its
        # examples and users' launch scripts read (node_rank=$PAI_TASK_INDEX).
        "PAI_TASK_INDEX": str(me.index),
        "PAI_CONTAINER_HOST_IP": me.node_address,
        # The first only, as OpenPAI's runtime took it: sshd listens on it
        # (the prologue), and the job's SSH details name it.
        "PAI_CONTAINER_SSH_PORT": str((me.ports.get(SSH_PORT_LABEL) or [""])[0]),
        "PAI_SSH_AUTHORIZED_KEYS": authorized_keys,
        # Early generation.
        "PAI_TASK_ROLE_NAME": me.role,
        "PAI_TASK_ROLE_NUM": str(my_role.task_number),
        "PAI_TASK_CPU_NUM": str(my_role.cpu_number),
        "PAI_TASK_MEM_MB": str(my_role.memory_mb),
        "PAI_TASK_GPU_NUM": str(my_role.gpu_number),
        "PAI_TASK_ROLE_INDEX": str(me.index),
        "PAI_TASK_ROLE_NO": str(role_names.index(me.role)),
        "PAI_TASKS_NUM": str(spec.total_tasks),
        "PAI_TASK_ROLES_NUM": str(len(roles)),
        "PAI_KILL_ALL_ON_COMPLETED_TASK_NUM": str(spec.kill_all_on_completed_task_number or 0),
        "PAI_CURRENT_CONTAINER_IP": addr(me),
        "PAI_CURRENT_CONTAINER_PORT": str(main_port(spec, me.role, me.ports) or ""),
        # GPUs: only the allocated devices; "void" hides all GPUs from CUDA
        # images, which otherwise default to NVIDIA_VISIBLE_DEVICES=all.
        "NVIDIA_VISIBLE_DEVICES": ",".join(map(str, me.gpus)) if me.gpus else "void",
    })
    for label, ports in me.ports.items():
        env[f"PAI_CONTAINER_HOST_{label}_PORT_LIST"] = ",".join(map(str, ports))
    for role in roles:
        name = role.name
        env[f"PAI_TASK_ROLE_TASK_COUNT_{name}"] = str(role.task_number)
        env[f"PAI_RESOURCE_{name}"] = role.resource_string()
        env[f"PAI_MIN_FAILED_TASK_COUNT_{name}"] = "" if role.min_failed_task_count is None else str(role.min_failed_task_count)
        env[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{name}"] = "" if role.min_succeeded_task_count is None else str(role.min_succeeded_task_count)
        env[f"PAI_TASK_ROLE_{name}_HOST_LIST"] = host_list(name)
        for peer in by_role[name]:
            env[f"PAI_HOST_IP_{name}_{peer.index}"] = addr(peer)
            for label, ports in peer.ports.items():
                env[f"PAI_PORT_LIST_{name}_{peer.index}_{label}"] = ",".join(map(str, ports))
    # The early reference's, by role number, after the lists by name: a role
    # named "1" must not take the place of the second role's list.
    for number, role in enumerate(roles):
        env[f"PAI_TASK_ROLE_{number}_HOST_LIST"] = host_list(role.name)
    return env


def extra_hosts(*, me: PeerTask, peers: list[PeerTask]) -> dict[str, str]:
    """`<role>-<index>` names of the other tasks, for ssh/MPI between them."""
    hosts: dict[str, str] = {}
    for peer in peers:
        if (peer.role, peer.index) == (me.role, me.index):
            continue
        address = peer_address(peer, seen_from_engine=me.engine_id)
        if _is_ip(address):
            hosts[f"{peer.role}-{peer.index}"] = address
    return hosts


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
