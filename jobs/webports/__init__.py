"""The portal's authenticated reverse proxy to tasks' web ports.

Web-labelled ports (WEB_PORT_LABELS) are published on their node's loopback
only (jobs/node/runner.py); their owner reaches them through the portal at
a host name per task and port, t<task attempt>-<port>.PORTAL_PROXY_DOMAIN,
HTTP and WebSocket alike. Who may, and the ticket and cookie that carry
the sign-in to that host, are jobs/services/webports.py; this package only
routes by Host (app.HostRouter, mounted in portal/asgi.py), checks, and
forwards (forward_http.py, forward_ws.py) without passing any credential of
the portal's to the job (headers.py), always through the node agent's
forwarder (node_link.py; jobs/node/webforward.py on the node). SECURITY.md,
"Web ports", has the why.
"""
