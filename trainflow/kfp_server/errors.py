"""The server's error vocabulary: an HTTP status plus the gRPC code the real API would return.

The real KFP API server is a grpc-gateway; its errors are ``google.rpc.Status`` JSON bodies
(``{"code": <grpc code>, "message": ..., "details": []}``, plus the legacy ``"error"`` field)
with the HTTP status that grpc-gateway maps the code to (``runtime.HTTPStatusFromCode``).
"""

from __future__ import annotations

from enum import IntEnum


class GrpcCode(IntEnum):
    """gRPC status codes used here (google.golang.org/grpc/codes)."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    FAILED_PRECONDITION = 9
    ABORTED = 10
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAUTHENTICATED = 16


_HTTP_STATUS = {
    GrpcCode.INVALID_ARGUMENT: 400,
    GrpcCode.NOT_FOUND: 404,
    GrpcCode.ALREADY_EXISTS: 409,
    GrpcCode.PERMISSION_DENIED: 403,
    GrpcCode.FAILED_PRECONDITION: 400,
    GrpcCode.ABORTED: 409,
    GrpcCode.UNIMPLEMENTED: 501,
    GrpcCode.INTERNAL: 500,
    GrpcCode.UNAUTHENTICATED: 401,
}


class ApiError(Exception):
    """An error the API answers with; ``str(err)`` is the message sent to the client.

    Args:
        code: the gRPC code; the HTTP status follows grpc-gateway's mapping.
        message: one line for the client.
    """

    def __init__(self, code: GrpcCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self.code]

    def body(self) -> dict[str, object]:
        """The JSON body: google.rpc.Status plus grpc-gateway's legacy ``error`` field."""
        return {"error": self.message, "code": int(self.code), "message": self.message, "details": []}


def invalid_argument(message: str) -> ApiError:
    return ApiError(GrpcCode.INVALID_ARGUMENT, f"Invalid input error: {message}")


def not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(GrpcCode.NOT_FOUND, f"{kind} {object_id} not found")
