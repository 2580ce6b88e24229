"""Typed errors and the one place they map to gRPC status codes.

| error                | gRPC code            | when                                                   |
|----------------------|----------------------|--------------------------------------------------------|
| InvalidRequest       | INVALID_ARGUMENT     | empty/too many texts, too long input, bad options      |
| Overloaded           | RESOURCE_EXHAUSTED   | queue full, or the request needs more memory than the budget |
| ShuttingDown         | UNAVAILABLE          | the server is draining (SIGTERM)                       |
| DeadlineExceeded     | DEADLINE_EXCEEDED    | the caller's deadline passed while queued or decoding  |
| Cancelled            | CANCELLED            | the caller went away                                   |
| InferenceFailed      | INTERNAL             | the model failed on the batch holding this request     |
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL


class InvalidRequest(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class Overloaded(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ShuttingDown(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ServiceError):
    code = grpc.StatusCode.CANCELLED


class InferenceFailed(ServiceError):
    code = grpc.StatusCode.INTERNAL


def status_of(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and caller-facing message of any error; never a stack trace."""
    if isinstance(error, ServiceError):
        return error.code, str(error)
    return grpc.StatusCode.INTERNAL, "internal error while translating; the server logged the details"
