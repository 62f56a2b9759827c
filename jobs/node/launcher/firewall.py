"""The node's firewall for task containers: iptables rules the node agent
installs when it starts (it runs as root on the engine's host, as code
staging already requires). No Django, no Docker SDK.

Every task network's bridge is named `pai-...` (`bridge_name`), so a few
rules match all of them, whichever jobs come and go:

    INPUT        from a task bridge: replies (ESTABLISHED, RELATED) and DNS
                 pass; anything else addressed to the node itself is
                 rejected: the portal, Redis or the Docker API on TCP, the
                 host's sshd, any port that is not a published task port.
                 (Published ports are DNATed in PREROUTING, before INPUT, so
                 they still work, through FORWARD.)
    DOCKER-USER  from a task bridge to 169.254.0.0/16 and 100.100.100.200
                 (cloud metadata services: most clouds', Alibaba's) is
                 rejected.

Traffic between containers on different networks is dropped by Docker
itself (its DOCKER-ISOLATION chains); between one-task jobs' containers by
ICC off: the shared network's enable_icc=false, or the engine's own
--icc=false when its default bridge is ours (`pai-default`, scripts/lib.sh).

Each agent installs its own copy of the rules, marked with a comment that
names it (`host:pid`), and removes it when it stops with no task running;
with tasks left running (they are adopted by the next agent) the rules stay.
Copies of agents that are gone (SIGKILL) are removed by the next agent that
starts on the host, after it installed its own, so the tasks are never
unprotected meanwhile.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess

from jobs.node.holders import holder_is_gone

BRIDGE_PREFIX = "pai-"
COMMENT = "pai-task-firewall"
# Link-local (AWS, GCP, Azure, Oracle, ...), and Alibaba Cloud's, which is in
# the shared 100.64/10 (the rest of that range may be a VPN's: left open).
METADATA_NETWORKS = ("169.254.0.0/16", "100.100.100.200/32")


class FirewallError(Exception):
    pass


def bridge_name(network: str) -> str:
    """The Linux bridge of a task network (at most 15 characters)."""
    return BRIDGE_PREFIX + hashlib.sha1(network.encode()).hexdigest()[:11]


def is_task_bridge(name: str) -> bool:
    """Do the rules below match this Linux bridge (`-i pai-+`)?"""
    return name.startswith(BRIDGE_PREFIX) and len(name) > len(BRIDGE_PREFIX)


def _rules(owner: str) -> list[tuple[str, list[str]]]:
    """(chain, rule) in the order they must end up at the top of the chain."""
    bridges = ["-i", BRIDGE_PREFIX + "+"]
    tag = ["-m", "comment", "--comment", f"{COMMENT} {owner}"]
    return [
        ("INPUT", bridges + ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"] + tag + ["-j", "ACCEPT"]),
        ("INPUT", bridges + ["-p", "udp", "--dport", "53"] + tag + ["-j", "ACCEPT"]),
        ("INPUT", bridges + ["-p", "tcp", "--dport", "53"] + tag + ["-j", "ACCEPT"]),
        ("INPUT", bridges + tag + ["-j", "REJECT"]),
        *[("DOCKER-USER", bridges + ["-d", network] + tag + ["-j", "REJECT"]) for network in METADATA_NETWORKS],
    ]


def _iptables(*args: str) -> str:
    try:
        done = subprocess.run(["iptables", "-w", "10", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise FirewallError(f"iptables {' '.join(args[:2])} failed: {exc}") from None
    if done.returncode != 0:
        raise FirewallError(f"iptables {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done.stdout


def install(owner: str) -> None:
    """Put this agent's copy of the rules at the top of INPUT and DOCKER-USER
    (Docker makes DOCKER-USER; a remote engine cannot be protected from
    here, and that fails loudly). Then drop copies of agents that are gone."""
    rules = _rules(owner)
    if installed_owners().get(owner) != len(rules):
        remove(owner)  # none, or a part left by a failure: start over
        for chain, rule in reversed(rules):
            _iptables("-I", chain, "1", *rule)
    remove_stale()


def remove(owner: str) -> None:
    for chain, line in _our_lines():
        if _owner_of(line) == owner:
            _delete(chain, line)


def _delete(chain: str, line: str) -> None:
    """Delete one listed rule. Agents starting together each sweep stale
    copies, so another may have deleted it since we listed it: a rule that
    is no longer there is what we wanted, not a failure."""
    try:
        _iptables("-D", chain, *shlex.split(line)[2:])
    except FirewallError:
        if line in _iptables("-S", chain).splitlines():
            raise


def remove_stale() -> None:
    """Remove the copies of agents of this host whose process is gone."""
    for owner in installed_owners():
        if holder_is_gone(owner):
            remove(owner)


def installed_owners() -> dict[str, int]:
    """{owner: number of rules} of every copy installed on this host."""
    owners: dict[str, int] = {}
    for _chain, line in _our_lines():
        owner = _owner_of(line)
        owners[owner] = owners.get(owner, 0) + 1
    return owners


def installed_rules() -> list[str]:
    """Our rules as `iptables -S` prints them (for tests and admins)."""
    return [line for _chain, line in _our_lines()]


def _our_lines() -> list[tuple[str, str]]:
    lines = []
    for chain in ("INPUT", "DOCKER-USER"):
        try:
            listing = _iptables("-S", chain)
        except FirewallError:
            continue  # no DOCKER-USER chain: nothing of ours in it either
        lines += [(chain, line) for line in listing.splitlines() if f'"{COMMENT} ' in line]
    return lines


def _owner_of(line: str) -> str:
    words = shlex.split(line)
    comment = words[words.index("--comment") + 1]
    return comment.removeprefix(COMMENT).strip()
