"""Errors of the storage package. Messages are shown to users as they are,
so they say what went wrong and what was expected, and never carry secrets."""


class StorageError(Exception):
    """Storage could not do what was asked; str(exc) is for the user."""


class StorageAccessDenied(StorageError):
    """The path exists (or may), but this user, or the storage itself, refuses it."""


class StorageNotFound(StorageError):
    """No file or folder at that path."""


class StorageQuotaExceeded(StorageError):
    """A write would take a user past their storage quota (quota.py)."""


class StorageSourceUnreadable(StorageError):
    """What was being written could not be read: a local file on this
    machine, an upload's body. The storage itself answered; trying it again
    will not help, unlike StorageUnavailable."""


def source_unreadable(path: str, exc: OSError) -> StorageSourceUnreadable:
    return StorageSourceUnreadable(f"could not read what was being written to {path}: {exc.strerror or exc} "
                                   "(a local read, not the storage)")


class StorageUnavailable(StorageError):
    """The storage did not answer (refused, timed out) or cannot take writes
    yet (HDFS safe mode): worth trying again later, unlike the others."""
