import os

from django.apps import AppConfig
from django.db.backends.signals import connection_created


def _private_sqlite_file(sender, connection, **kwargs) -> None:
    """SQLite makes its file with the process's umask (often 0644); it holds
    password hashes and sessions, so the portal's user alone may read it.
    Its -wal and -shm files are made with the database file's mode."""
    name = str(connection.settings_dict.get("NAME") or "")
    if connection.vendor != "sqlite" or not name or name.startswith((":", "file:")):
        return
    for suffix in ("", "-wal", "-shm"):
        try:
            os.chmod(name + suffix, 0o600)
        except (FileNotFoundError, PermissionError):
            pass  # not made yet, or not ours: var/ (0700) still closes the way


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "GPU jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs import signals  # noqa: F401  (connects the receivers)

        connection_created.connect(_private_sqlite_file, dispatch_uid="jobs.private_sqlite_file")
