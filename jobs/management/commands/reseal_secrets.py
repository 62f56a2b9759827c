"""Seal every stored secret under the current secret key: jobs' SSH private
keys and protocol v2 secrets stored in plain text before sealing existed,
and anything sealed under a key of PORTAL_SECRET_KEY_FALLBACKS (run it after
rotating PORTAL_SECRET_KEY, then drop the old key from the fallbacks)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Model

from jobs.keys import SealedKeyUnreadable, resealed
from jobs.models import Job, NotificationSettings

# (model, field) of every value jobs/keys.py seals.
SEALED_FIELDS: tuple[tuple[type[Model], str], ...] = (
    (Job, "ssh_private_key"),
    (Job, "secrets_sealed"),
    (NotificationSettings, "webhook_secret_sealed"),
)


class Command(BaseCommand):
    help = ("Seal plain-text job keys and secrets, and re-seal values sealed with an old secret key "
            "(PORTAL_SECRET_KEY_FALLBACKS) under the current one. Safe to run repeatedly and while the portal runs.")

    def handle(self, *args, **options) -> None:
        unreadable = 0
        for model, field in SEALED_FIELDS:
            changed = 0
            rows = model.objects.exclude(**{field: ""}).values_list("pk", field)
            for pk, stored in rows.iterator(chunk_size=500):
                try:
                    new = resealed(stored)
                except SealedKeyUnreadable:
                    unreadable += 1
                    self.stderr.write(f"{model.__name__} {pk}: {field} opens with no key this portal has")
                    continue
                # Conditional: a row changed meanwhile (a job deleted, a
                # webhook secret replaced) keeps its newer value.
                if new is not None:
                    changed += model.objects.filter(pk=pk, **{field: stored}).update(**{field: new})
            if options["verbosity"]:
                self.stdout.write(f"{model.__name__}.{field}: {changed} sealed again")
        if unreadable:
            raise CommandError(f"{unreadable} value(s) open with no current or fallback secret key; "
                               "add the key they were sealed with to PORTAL_SECRET_KEY_FALLBACKS and run again")
