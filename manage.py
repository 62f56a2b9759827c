#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A setting missing or wrong (a fresh shell, a typo): its message
        # names the variable; a traceback would only bury it.
        hint = ""
        if sys.argv[1:2] == ["node_agent"]:
            hint = ("\nOn a node machine, `scripts/join-node <portal-url> <join-token>` fetches the node's settings "
                    "from the portal and starts the agent with them (README, \"More nodes\").")
        sys.exit(f"error: {exc}{hint}")


if __name__ == "__main__":
    main()
