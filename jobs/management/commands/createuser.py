"""Create a portal user (or an admin) from the command line.

    manage.py createuser alice                       # asks for the password
    manage.py createuser bob --password-file pw.txt --vc vc1 --vc vc2
    manage.py createuser carol --admin --generate-password

Usernames follow OpenPAI's rule: letters, digits and underscores.
"""

from __future__ import annotations

import getpass
import secrets
from pathlib import Path

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from jobs.models import User, VirtualCluster


class Command(BaseCommand):
    help = "Create a user who can log in to the portal; --admin makes an administrator."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--admin", action="store_true", help="may see every job and manage the cluster")
        secret = parser.add_mutually_exclusive_group()
        secret.add_argument("--password-file", type=Path, help="read the password from this file's first line")
        secret.add_argument("--generate-password", action="store_true", help="make one and print it once")
        parser.add_argument("--vc", action="append", default=[], metavar="NAME",
                            help="a virtual cluster the user may submit to (repeatable)")

    def handle(self, *args, username: str, admin: bool, password_file: Path | None, generate_password: bool,
               vc: list[str], **options) -> None:
        if User.objects.filter(username=username).exists():
            raise CommandError(f'a user named "{username}" already exists')
        clusters = self._virtual_clusters(vc)
        password = self._password(password_file, generate_password)
        user = User(username=username, is_staff=admin, is_superuser=admin)
        try:
            user.full_clean(exclude=["password"])
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        user.set_password(password)
        try:
            with transaction.atomic():
                user.save()
                for cluster in clusters:
                    cluster.users.add(user)
        except IntegrityError:  # made meanwhile, in this case or another
            raise CommandError(f'a user named "{username}" already exists') from None
        role = "admin" if admin else "user"
        self.stdout.write(f"created {role} {username}" + (f" with password {password}" if generate_password else ""))

    def _virtual_clusters(self, names: list[str]) -> list[VirtualCluster]:
        found = {vc.name: vc for vc in VirtualCluster.objects.filter(name__in=names)}
        missing = [name for name in names if name not in found]
        if missing:
            raise CommandError(f"no virtual cluster named {', '.join(missing)}")
        return [found[name] for name in names]

    def _password(self, path: Path | None, generate: bool) -> str:
        if generate:
            return secrets.token_urlsafe(12)
        if path is not None:
            try:
                return path.read_text().splitlines()[0]
            except (OSError, IndexError) as exc:
                raise CommandError(f"--password-file {path}: cannot read a password ({exc})") from None
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Password (again): "):
            raise CommandError("the two passwords differ")
        return first
