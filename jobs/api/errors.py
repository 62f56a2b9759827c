"""The API's errors: OpenPAI's code names and statuses, as JSON.

Every failure leaves the API as `{"code": "...", "message": "..."}` so
scripts written for OpenPAI can keep checking `code`. A view raises
ApiError; the wrapper in jobs/api/http.py turns it (and anything else that
escapes) into a response.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse

# OpenPAI's names with the statuses it used; the last block is ours.
STATUS: dict[str, int] = {
    "InvalidParametersError": 400,
    "NoUserError": 400,
    "IncorrectPasswordError": 400,
    "UnauthorizedUserError": 401,
    "ForbiddenUserError": 403,
    "NoEnoughQuotaError": 403,
    "RemoveAdminError": 403,
    "NoApiError": 404,
    "NoJobError": 404,
    "NoJobConfigError": 404,
    "NoJobSshInfoError": 404,
    "NoVirtualClusterError": 404,
    "ConflictJobError": 409,
    "ConflictUserError": 409,
    "UnknownError": 500,
    # ours: a task that a job does not have; a wrong HTTP method; too many
    # failed logins; a request body over the size limit; a user holding the
    # most live API tokens allowed.
    "NoTaskError": 404,
    "MethodNotAllowedError": 405,
    "RequestTooLargeError": 413,
    "TooManyRequestsError": 429,
    "ServiceUnavailableError": 503,
    "TooManyTokensError": 409,
}


class ApiError(Exception):
    """An error the client should see; `status` defaults from STATUS."""

    def __init__(self, code: str, message: str, *, status: int | None = None,
                 headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS.get(code, 400)
        self.headers = headers or {}
        self.extra = extra or {}

    def response(self) -> JsonResponse:
        return error_response(self.code, self.message, status=self.status, headers=self.headers, extra=self.extra)


def error_response(code: str, message: str, *, status: int | None = None, headers: dict[str, str] | None = None,
                   extra: dict[str, Any] | None = None) -> JsonResponse:
    body = {"code": code, "message": message, **(extra or {})}
    response = JsonResponse(body, status=status or STATUS.get(code, 400))
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def invalid(message: str) -> ApiError:
    return ApiError("InvalidParametersError", message)


def unauthorized(message: str = "Guest is not allowed to do this operation: send Authorization: Bearer <token> "
                 "(get one with POST /api/v1/token).") -> ApiError:
    return ApiError("UnauthorizedUserError", message, headers={"WWW-Authenticate": 'Bearer realm="api"'})


def forbidden(message: str) -> ApiError:
    return ApiError("ForbiddenUserError", message)


def no_job(username: str, name: str) -> ApiError:
    # The same words whether the job does not exist or belongs to someone
    # else: a stranger learns nothing about other people's jobs.
    return ApiError("NoJobError", f"Job {name} of user {username} is not found.")
