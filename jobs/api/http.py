"""The plumbing every API view shares: one view per resource that dispatches
on the HTTP method, checks access, answers CORS, reads JSON bodies and query
parameters, and turns every failure into OpenPAI-style JSON.
"""

from __future__ import annotations

import codecs
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import (BadRequest, RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent,
                                    TooManyFilesSent)
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.csrf import csrf_exempt

from jobs import jsonc
from jobs.api.auth import Access, authenticate
from jobs.api.errors import ApiError, error_response, invalid
from jobs.services import SubmitError, stream_slots
from jobs.services.ratelimit import client_address
from jobs.services.users import UserError
from jobs.spec import SpecError

log = logging.getLogger(__name__)

Handler = Callable[..., HttpResponse]
ALLOWED_REQUEST_HEADERS = "Authorization, Content-Type, X-CSRFToken"
EXPOSED_HEADERS = "Location, Link, X-Total-Count, Retry-After"
# As deep as a job config may nest (jobs/jsonc.py): no API body needs more.
MAX_BODY_DEPTH = jsonc.MAX_DEPTH


def handler(access: Access) -> Callable[[Handler], Handler]:
    """Mark a function as the handler of one method, with the access it needs."""

    def mark(function: Handler) -> Handler:
        function.api_access = access  # type: ignore[attr-defined]
        return function

    return mark


def resource(**handlers: Handler) -> Callable[..., HttpResponse]:
    """A Django view for one API path: `resource(GET=show, DELETE=remove)`."""
    methods = dict(handlers)
    if "GET" in methods:
        methods.setdefault("HEAD", methods["GET"])
    allow = ", ".join(sorted({*methods, "OPTIONS"}))

    @login_not_required  # the API authenticates on its own (jobs/api/auth.py)
    @csrf_exempt  # ... and checks CSRF itself when the session is used
    def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        if request.method == "OPTIONS":
            response = _preflight(request, allow)
        else:
            response = _dispatch(request, methods.get(request.method or ""), allow, kwargs)
        _cors(request, response)
        return response

    view.api_methods = methods  # type: ignore[attr-defined]
    return view


def _dispatch(request: HttpRequest, function: Handler | None, allow: str, kwargs: dict[str, Any]) -> HttpResponse:
    try:
        if function is None:
            raise ApiError("MethodNotAllowedError", f"{request.method} is not supported here; use {allow}.",
                           headers={"Allow": allow})
        authenticate(request, function.api_access)  # type: ignore[attr-defined]
        return function(request, **kwargs)
    except ApiError as exc:
        return exc.response()
    except SpecError as exc:
        return error_response("InvalidParametersError", str(exc), extra={"problems": [p.as_dict() for p in exc.problems]})
    except SubmitError as exc:  # the services' refusals carry OpenPAI's code names already
        return error_response(exc.code, exc.message, extra={"field": exc.field} if exc.field else None)
    except UserError as exc:
        return error_response(exc.code, exc.message, status=exc.status)
    except RequestDataTooBig:
        return error_response("RequestTooLargeError",
                              f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE // 1024} KB.")
    except (TooManyFieldsSent, TooManyFilesSent):
        return error_response("InvalidParametersError", "The request has more than "
                              f"{settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} query parameters or form fields.")
    except MultiPartParserError as exc:
        return error_response("InvalidParametersError", f"The multipart/form-data body cannot be read: {exc}")
    except BadRequest as exc:  # a form Django will not decode, read by a view or by a session's CSRF check
        return error_response("InvalidParametersError", f"The request body cannot be read: {exc}")
    except SuspiciousOperation:  # what Django refuses with a 400 on a page
        log.warning("API %s %s refused as suspicious", request.method, request.path, exc_info=True)
        return error_response("InvalidParametersError", "The request was refused as malformed.")
    except Http404:
        return error_response("NoApiError", "Not found.")
    except Exception:
        log.exception("API %s %s failed", request.method, request.path)
        return error_response("UnknownError", "The server failed to handle this request; the error is in the portal's log.")


def _origin_allowed(origin: str) -> bool:
    allowed = settings.CORS_ALLOWED_ORIGINS
    return bool(origin) and ("*" in allowed or origin in allowed)


def _cors(request: HttpRequest, response: HttpResponse) -> None:
    """Cross-origin callers see responses only from CORS_ALLOWED_ORIGINS (none
    by default). Cookies are never allowed cross-origin: tokens only."""
    origin = request.headers.get("Origin", "")
    if not _origin_allowed(origin):
        return
    response["Access-Control-Allow-Origin"] = "*" if "*" in settings.CORS_ALLOWED_ORIGINS else origin
    response["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
    patch_vary_headers(response, ["Origin"])


def _preflight(request: HttpRequest, allow: str) -> HttpResponse:
    response = HttpResponse(status=204)
    response["Allow"] = allow
    if _origin_allowed(request.headers.get("Origin", "")):
        response["Access-Control-Allow-Methods"] = allow
        response["Access-Control-Allow-Headers"] = ALLOWED_REQUEST_HEADERS
        response["Access-Control-Max-Age"] = "600"
    return response


# ------------------------------------------------------------------ requests


def json_body(request: HttpRequest) -> dict[str, Any]:
    """The request's parameters as a dict: a JSON object, or a form (OpenPAI's
    own docs get a token with `curl -d username=... -d password=...`, and its
    jQuery web portal stops a job with a form-encoded PUT)."""
    raw = request.body
    content_type = request.content_type or ""
    stripped = raw.lstrip()
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data") and not stripped.startswith(b"{"):
        if content_type == "multipart/form-data":  # parsed by Django, for POST only: no OpenPAI client sends more
            form = {key: request.POST.get(key) for key in request.POST}
        else:
            form = _urlencoded(request)
        _check_body(form)  # a form's "%00" is a NUL too
        return form
    if not stripped:
        return {}
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise invalid("The request body is not UTF-8 text.") from None
    except RecursionError:  # the C decoder recurses once per level: "[" * 100000 gets here
        raise invalid(f"The request body is nested more than {MAX_BODY_DEPTH} levels deep.") from None
    except ValueError as exc:
        raise invalid(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(value, dict):
        raise invalid(f"The request body must be a JSON object, got {type(value).__name__}.")
    _check_body(value)
    return value


def _urlencoded(request: HttpRequest) -> dict[str, str]:
    """A form body, for any method: Django fills request.POST for POST only.
    Django's rules otherwise (UTF-8 only, DATA_UPLOAD_MAX_NUMBER_FIELDS, the
    last of a repeated field wins; the body's size was checked as it was
    read), except that bytes which are not UTF-8, raw or %-escaped, are
    refused where Django would silently replace or re-read them."""
    charset = (request.content_params or {}).get("charset", "utf-8")
    if _codec(charset) != "utf-8":
        raise invalid(f"A form body must be UTF-8 text, not charset={charset}.")
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    try:
        return dict(parse_qsl(request.body.decode(), keep_blank_values=True, errors="strict", max_num_fields=limit))
    except UnicodeDecodeError:
        raise invalid("The form body is not UTF-8 text (a byte or %-escape in it is not).") from None
    except ValueError:  # parse_qsl's only other refusal, as strict_parsing is off
        raise invalid(f"The form body has more than {limit} fields.") from None


def _codec(charset: str) -> str | None:
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return None


def _check_body(body: dict[str, Any]) -> None:
    """Refuse what decodes but cannot be stored or handled later, naming
    where it is: nesting past MAX_BODY_DEPTH (as the job config reader does),
    and strings, keys or values, holding a NUL or half of a surrogate pair
    (JSON's "\\ud800" escape decodes to one; the database cannot store
    either). Walked with a stack, not recursion, so depth cannot crash it."""
    pending: list[tuple[Any, str, int]] = [(body, "", 1)]
    while pending:
        value, path, depth = pending.pop()
        if isinstance(value, str):
            _check_body_text(value, path or "the request body")
            continue
        if isinstance(value, (dict, list)) and depth > MAX_BODY_DEPTH:
            raise invalid(f"The request body is nested more than {MAX_BODY_DEPTH} levels deep (at {path}).")
        if isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                _check_body_text(key, f"a key in {path or 'the request body'}")
                pending.append((item, child, depth + 1))
        elif isinstance(value, list):
            pending.extend((item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value))


def _check_body_text(text: str, where: str) -> None:
    problem = jsonc.unstorable(text)  # as job configs are refused
    if problem == jsonc.SURROGATE_PROBLEM:
        raise invalid(f"{where}: {problem}; send whole characters.")
    if problem:
        raise invalid(f"{where}: {problem}.")


def string_param(params: dict[str, Any], name: str, *, required: bool = True, max_length: int = 256) -> str | None:
    """A string parameter; an explicit null is a wrong type, not an absence."""
    if name not in params:
        if required:
            raise invalid(f"{name} is required.")
        return None
    value = params[name]
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string, got {type(value).__name__}.")
    if len(value) > max_length:
        raise invalid(f"{name} must be at most {max_length} characters.")
    return value


_WHOLE_NUMBER = re.compile(r"-?[0-9]+")


def optional_int_param(params: Any, name: str, *, minimum: int, maximum: int) -> int | None:
    """An integer from a query string or JSON body, or None if absent
    (numeric strings are accepted: OpenPAI clients send `"expiration": "3600"`)."""
    if name not in params:
        return None
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise invalid(f"{name} must be a whole number between {minimum} and {maximum}.")
    # Plain ASCII digits only: int() also takes "١٢", "1_0" and " 5".
    if isinstance(value, str) and not _WHOLE_NUMBER.fullmatch(value):
        raise invalid(f"{name} must be a whole number between {minimum} and {maximum}, got {value!r}.")
    number = int(value)
    if not minimum <= number <= maximum:
        raise invalid(f"{name} must be between {minimum} and {maximum}, got {number}.")
    return number


def int_param(params: Any, name: str, *, default: int, minimum: int, maximum: int) -> int:
    value = optional_int_param(params, name, minimum=minimum, maximum=maximum)
    return default if value is None else value


def bool_param(params: dict[str, Any], name: str) -> bool | None:
    if name not in params:
        return None
    value = params[name]
    if isinstance(value, bool):
        return value
    raise invalid(f"{name} must be true or false.")


# ----------------------------------------------------------------- responses


def ok(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JsonResponse:
    response = JsonResponse(body, status=status, safe=False, json_dumps_params={"ensure_ascii": False})
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def streamed(request: HttpRequest, parts: Iterable[bytes]) -> StreamingHttpResponse:
    """JSON written as `parts` come, one of the caller's limited open
    streams (jobs/services/stream_slots.py): past the limit, 429
    TooManyRequestsError with Retry-After (503 ServiceUnavailableError
    past the web worker's). Call it once the caller may see
    what `parts` holds, so a refused request takes no one's slot."""
    try:
        held = stream_slots.stream_hold(user=request.user, address=client_address(request), content=parts,
                                        head=request.method == "HEAD")
    except stream_slots.TooManyStreams as exc:
        raise ApiError(exc.code, exc.message, status=exc.status, headers={"Retry-After": str(exc.retry_after)}) from None
    return StreamingHttpResponse(held, content_type="application/json")


def api_url(request: HttpRequest, route: str, **kwargs: Any) -> str:
    """An absolute URL of an API route under the prefix this request used."""
    namespace = request.resolver_match.namespace if request.resolver_match else "api"
    return request.build_absolute_uri(reverse(f"{namespace or 'api'}:{route}", kwargs=kwargs))


def no_api(request: HttpRequest) -> HttpResponse:
    response = error_response("NoApiError", f"There is no API at {request.path}; see {_docs_hint(request)}.")
    _cors(request, response)
    return response


def _docs_hint(request: HttpRequest) -> str:
    return request.build_absolute_uri(reverse("api:openapi"))


# A catch-all under both prefixes: unknown paths get JSON, not an HTML page.
no_api_view = login_not_required(csrf_exempt(no_api))
