"""WSGI entry point (for tools that want it; gunicorn serves portal.asgi)."""

import os

from portal.handler import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()
