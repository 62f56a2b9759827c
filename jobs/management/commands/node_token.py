"""Make, list and revoke node join tokens (the Nodes page does the same).

    manage.py node_token                      make one (valid one day) and print it
    manage.py node_token --ttl 3600 --label rack-3
    manage.py node_token --list
    manage.py node_token --revoke pjt_Ab12Cd34

A new node machine joins with `scripts/join-node <portal-url> <token>`.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from jobs.models import NodeJoinToken
from jobs.services import join_tokens


class Command(BaseCommand):
    help = "Make a node join token for scripts/join-node (or --list, or --revoke PREFIX)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--ttl", type=int, default=join_tokens.DEFAULT_SECONDS,
                            help=f"seconds the token stays valid ({join_tokens.MIN_SECONDS} to "
                                 f"{join_tokens.MAX_SECONDS}; default one day)")
        parser.add_argument("--label", default="", help="what the token is for, shown in the list")
        parser.add_argument("--list", action="store_true", help="list the tokens (never their secrets)")
        parser.add_argument("--revoke", metavar="PREFIX",
                            help="revoke the token whose prefix this is, as --list shows it (pjt_ may be left out)")

    def handle(self, *args, **options) -> None:
        if options["list"]:
            self._list()
        elif options["revoke"]:
            self._revoke(options["revoke"])
        else:
            self._make(options["ttl"], options["label"])

    def _make(self, ttl: int, label: str) -> None:
        if not join_tokens.MIN_SECONDS <= ttl <= join_tokens.MAX_SECONDS:
            raise CommandError(f"--ttl {ttl}: expected {join_tokens.MIN_SECONDS} to {join_tokens.MAX_SECONDS} seconds")
        made = join_tokens.join_token_create(by=None, seconds=ttl, label=label or "manage.py node_token")
        self.stdout.write(made.key)
        self.stderr.write(f"valid until {made.token.expires_at.isoformat(timespec='seconds')}; on the node machine: "
                          f"scripts/join-node <portal-url> {made.token.prefix}… --name NODE --address ADDRESS")

    def _list(self) -> None:
        now = timezone.now()
        for token in NodeJoinToken.objects.select_related("created_by"):
            state = "revoked" if token.revoked_at else ("expired" if token.expires_at <= now else "valid")
            used = token.last_used_at.isoformat(timespec="seconds") if token.last_used_at else "never"
            self.stdout.write(f"{token.prefix}…  {state:8} expires {token.expires_at.isoformat(timespec='seconds')}  "
                              f"uses {token.uses}  last used {used}  {token.label}")

    def _revoke(self, prefix: str) -> None:
        found = join_tokens.join_tokens_matching(prefix)
        if not found:
            raise CommandError(f"--revoke {prefix}: no join token starts with that (see --list)")
        if len(found) > 1:
            raise CommandError(f"--revoke {prefix}: {len(found)} tokens start with that; give more of it")
        if join_tokens.join_token_revoke(token=found[0]):
            self.stdout.write(f"revoked {found[0].prefix}…")
        else:
            self.stdout.write(f"{found[0].prefix}… was revoked already")
