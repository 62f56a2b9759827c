"""The only writers of job state: views, the REST API and RQ tasks call these.

    submission  job_submit, suggest_job_name, parse_for_user, virtual_cluster_for
    lifecycle   job_stop, attempt_* (launch, running, exit), ContainerExit
    scheduling  schedule_pass, LaunchHere
    nodes       node_register, node_heartbeat, node_leave, nodes_mark_lost; engine identity clashes;
                node_cordon, node_drain, node_uncordon
    join_tokens node join tokens: create, match, revoke, use (scripts/join-node)
    node_settings  what a joining node is handed (read-only)
    cluster     vc_usage, node_usage, queue_position, never_fits_reason, config_fit (read-only)
    listing     the job list's filters, sorting and pages (read-only)
    access      port links, Jupyter and SSH access, idle notices; users' SSH keys; the job's private key
    storage_links  the job page's folder links, the storage page's folder URLs (read-only)
    pulls       image pulls on nodes: pull_start, pull_progress, pull_wait, pull_finish (the agent); pulls_shown, starting_pulls (the job page)
    terminals   browser terminal sessions: terminal_session_open, terminal_session_close
    tokens      API tokens: create, authenticate, revoke
    permissions_memo  per-process memo of token and virtual-cluster answers
    limits      per-user limits in a virtual cluster: which apply, the waiting-limit check (read-only)
    users       admin user management for the REST API
    ratelimit   failed-login limits (API and login form); action limits (live checks, API submissions)
    stream_slots  each user's limit of open streamed responses (downloads, whole lists), over all workers
"""

from jobs.services.lifecycle import (
    ContainerExit,
    JobStateError,
    attempt_claim_launch,
    attempt_keep_for_debug,
    attempt_mark_running,
    attempt_record_exit,
    attempt_set_ssh_available,
    attempt_unclaim,
    attempts_note_activity,
    job_delete,
    job_stop,
)
from jobs.services.cluster import (
    never_fits_reason,
    node_usage,
    queue_position,
    vc_usage,
)
from jobs.services.nodes import NodeInfo, node_heartbeat, node_leave, node_register, nodes_mark_lost
from jobs.services.scheduling import LaunchHere, schedule_pass
from jobs.services.pulls import PullCounts, pull_finish, pull_progress, pull_start, pull_wait, pulls_shown
from jobs.services.submission import (
    SubmitError,
    job_submit,
    parse_for_user,
    suggest_job_name,
    virtual_cluster_for,
)
from jobs.services.terminals import (
    TerminalForbidden,
    TerminalNotRunning,
    TerminalRefused,
    TerminalTarget,
    terminal_session_close,
    terminal_session_open,
)

__all__ = [
    "ContainerExit", "JobStateError", "NodeInfo", "SubmitError",
    "PullCounts", "pull_finish", "pull_progress", "pull_start", "pull_wait", "pulls_shown",
    "attempt_claim_launch", "attempt_keep_for_debug", "attempt_mark_running", "attempt_record_exit",
    "attempt_set_ssh_available", "attempts_note_activity",
    "attempt_unclaim", "job_delete", "job_stop", "never_fits_reason", "node_usage",
    "queue_position", "vc_usage", "job_submit", "node_heartbeat", "node_leave", "node_register", "nodes_mark_lost",
    "LaunchHere", "parse_for_user", "schedule_pass", "suggest_job_name", "virtual_cluster_for",
    "TerminalForbidden", "TerminalNotRunning", "TerminalRefused", "TerminalTarget",
    "terminal_session_close", "terminal_session_open",
]
