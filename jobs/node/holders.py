"""Who holds something on a node (a node's lock in Redis, a copy of the
firewall rules): a process, written "<host>:<pid>". A holder on this host
whose process is gone was killed; what it held may be taken over."""

from __future__ import annotations

import os
import socket


def this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_is_gone(holder: str) -> bool:
    """True only for a holder on this host whose process no longer exists
    (one on another host, or unreadable, may still be alive)."""
    host, _, pid = holder.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not _process_alive(int(pid))


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, alive
    return True
