"""ASGI entry point served by gunicorn with uvicorn workers.

Requests for a task's web port (a host under PORTAL_PROXY_DOMAIN) go to the
proxy, jobs/webports/. WebSockets (the browser terminal) go to Channels
consumers, from pages of the portal's own origin only (portal/ws_origin.py).
Plain HTTP goes to Django's WSGI handler on a fixed pool of long-lived
threads (a2wsgi): every view of the portal is synchronous, and Django's own
ASGI handler would run each request on a fresh thread (so a fresh database
connection, and CONN_MAX_AGE never applies) and would read sync streaming
responses (log and file downloads) whole into memory before sending the
first byte.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
get_asgi_application()  # sets Django up before the imports below

from portal.http_bridge import ThreadedWSGI  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from jobs.routing import websocket_urlpatterns  # noqa: E402
from jobs.webports.app import HostRouter, WebPortProxy  # noqa: E402
from portal.handler import get_wsgi_application  # noqa: E402
from portal.ws_origin import ExactOriginValidator  # noqa: E402

portal = ProtocolTypeRouter(
    {
        "http": ThreadedWSGI(get_wsgi_application(), workers=settings.PORTAL_HTTP_THREADS),
        "websocket": ExactOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
# Task hosts (<task>.PORTAL_PROXY_DOMAIN) go to the web-port proxy, which
# streams both ways in the event loop (jobs/webports/); all else is the portal.
application = HostRouter(portal=portal, proxy=WebPortProxy())
