"""Typed errors and the one place they map to gRPC status codes and HTTP statuses.

| error            | gRPC code          | HTTP | when                                                          |
|------------------|--------------------|------|---------------------------------------------------------------|
| InvalidRequest   | INVALID_ARGUMENT   | 400  | empty/too many texts, too long input, bad options, languages   |
|                  |                    |      | or markup (MarkupError)                                       |
| NotFound         | NOT_FOUND          | 404  | a stored glossary the caller does not have                    |
|                  |                    |      | (server/documents/glossaries.py)                              |
| Unauthenticated  | UNAUTHENTICATED    | 403  | no API key where the keys file admits no anonymous callers    |
| PermissionDenied | PERMISSION_DENIED  | 403  | an API key the keys file does not hold                        |
|                  |                    |      | (server/operations/keys.py)                                   |
| Overloaded       | RESOURCE_EXHAUSTED | 429  | front door or queue full or behind (server/doors/door.py), or |
|                  |                    |      | the request needs more memory than the budget                 |
|                  |                    |      | or a key over its requests per minute (HTTP adds Retry-After) |
| ShuttingDown     | UNAVAILABLE        | 503  | the server is draining (SIGTERM; HTTP adds Retry-After)       |
| Unavailable      | UNAVAILABLE        | 503  | a store the request needs is out of reach (Redis, /suggest)   |
| DeadlineExceeded | DEADLINE_EXCEEDED  | 504  | the caller's deadline (HTTP: http_timeout_s) passed while     |
|                  |                    |      | queued or decoding                                            |
| Cancelled        | CANCELLED          | 499  | the caller went away (nobody reads the answer)                |
| InferenceFailed  | INTERNAL           | 500  | the model failed on the batch holding this request            |
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL
    http_status = 500
    retry_after_s: float | None = None  # the caller's wait before a retry may succeed (HTTP Retry-After)


class InvalidRequest(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 403  # LibreTranslate's answer to a missing key


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class Overloaded(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ShuttingDown(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    retry_after_s = 1.0  # another replica serves it now; this one, once restarted


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE
    http_status = 503


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504


class Cancelled(ServiceError):
    code = grpc.StatusCode.CANCELLED
    http_status = 499


class InferenceFailed(ServiceError):
    code = grpc.StatusCode.INTERNAL
    http_status = 500


def grpc_code_of_http(status: int) -> str:
    """The name of the gRPC code whose errors answer HTTP with ``status`` (HTTP_<status> for none)."""
    if status == 200:
        return "OK"
    errors = [ServiceError, *ServiceError.__subclasses__()]
    return next((e.code.name for e in errors if e.http_status == status), f"HTTP_{status}")


def http_status_of(error: BaseException) -> tuple[int, str]:
    """The HTTP status and caller-facing message of any error, mirroring ``status_of``."""
    _, message = status_of(error)
    return (error.http_status if isinstance(error, ServiceError) else 500), message


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and caller-facing message of any error; never a stack trace."""
    if isinstance(error, ServiceError):
        return error.code, str(error)
    return grpc.StatusCode.INTERNAL, "internal error while translating; the server logged the details"
