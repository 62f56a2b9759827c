"""WebSocket routes (served through portal/asgi.py)."""

from django.urls import path

from jobs.terminal import TerminalConsumer

websocket_urlpatterns = [
    path("ws/terminal/<int:attempt_id>/", TerminalConsumer.as_asgi()),
]
