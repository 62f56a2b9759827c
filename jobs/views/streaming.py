"""Streamed page responses (a whole log, a storage download), each counted
toward its user's limit of open streams (jobs/services/stream_slots.py)."""

from __future__ import annotations

from collections.abc import Iterable

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from jobs.services import stream_slots
from jobs.services.ratelimit import client_address


def streaming_response(request: HttpRequest, content: Iterable[bytes] | Iterable[str], *, content_type: str,
                       headers: dict[str, str]) -> HttpResponse:
    """`content` streamed with `headers`; past the user's limit, a 429 that
    says so in plain words (a browser shows it as the download's page);
    past the web worker's, a 503.
    Call it only once the user may have what `content` holds."""
    try:
        held = stream_slots.stream_hold(user=request.user, address=client_address(request), content=content)
    except stream_slots.TooManyStreams as exc:
        refused = HttpResponse(exc.message, status=exc.status, content_type="text/plain; charset=utf-8")
        refused["Retry-After"] = str(exc.retry_after)
        return refused
    return StreamingHttpResponse(held, content_type=content_type, headers=headers)
