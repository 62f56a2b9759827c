"""WebSocket routes (served through portal/asgi.py)."""

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from jobs.terminal import TerminalConsumer


class NoSuchSocket(AsyncWebsocketConsumer):
    """Any other path: refused at the handshake (a 403). Without it Channels'
    router raises, and every such request is a 500 and a traceback."""

    async def connect(self) -> None:
        await self.close()


websocket_urlpatterns = [
    path("ws/terminal/<int:attempt_id>/", TerminalConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),
]
