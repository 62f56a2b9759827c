"""WebSocket routes (served through portal/asgi.py)."""

from django.urls import path

websocket_urlpatterns: list = []
