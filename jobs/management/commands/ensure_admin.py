"""Create the first admin account if there is none; print how to log in.

The credentials come from PORTAL_ADMIN_USER / PORTAL_ADMIN_PASSWORD, or a
password is generated, printed once, and kept in var/admin_password (mode
600) for later reference.
"""

import os
import secrets

from django.conf import settings
from django.core.management.base import BaseCommand

from jobs.models import User


class Command(BaseCommand):
    help = "Create the admin account on first run and print the login."

    def handle(self, *args, **options) -> None:
        username = os.environ.get("PORTAL_ADMIN_USER", "admin")
        password_file = settings.VAR_DIR / "admin_password"
        if User.objects.filter(username=username).exists():
            where = f" (password in {password_file})" if password_file.exists() else ""
            self.stdout.write(f"Admin login: {username}{where}")
            return
        password = os.environ.get("PORTAL_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        User.objects.create_superuser(username, password=password)
        if "PORTAL_ADMIN_PASSWORD" not in os.environ:
            password_file.parent.mkdir(parents=True, exist_ok=True)
            old_umask = os.umask(0o077)
            try:
                password_file.write_text(password + "\n")
            finally:
                os.umask(old_umask)
        self.stdout.write(f"Admin login: {username} / {password}")
