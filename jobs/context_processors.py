from django.conf import settings
from django.http import HttpRequest


def portal(request: HttpRequest) -> dict:
    return {"PORTAL_NAME": "GPU Job Portal", "STORAGE_BACKEND": settings.STORAGE_BACKEND}
