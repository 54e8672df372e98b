"""A failed call as a BerthError: its code, the service's message and the details decoded from the
trailers (typed ones from grpc-status-details-bin, facts from berth-error-details)."""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import any_pb2, json_format, struct_pb2
from google.protobuf.message import Message

from .proto import budget_pb2, error_details_pb2, lock_service_pb2, session_service_pb2, status_pb2

# The trailer in which berth repeats an error's details as JSON (see ERROR_DETAILS_HEADER in
# packages/shared/src/server/connect-errors.ts), for clients that do not decode the binary one.
ERROR_DETAILS_TRAILER = "berth-error-details"
# The standard gRPC trailer holding a serialized google.rpc.Status with typed details.
STATUS_DETAILS_TRAILER = "grpc-status-details-bin"


class BerthError(Exception):
    """A failed berth call: its gRPC code, the service's message, and the facts it sent.

    ``details`` are the typed details of ``grpc-status-details-bin``, unpacked into their generated
    classes where this module knows the type (``ErrorInfo``, ``RetryInfo``, ``BadRequest``,
    ``LockHeld``, ``SeqConflict``, ``FenceRejected``, ``IdempotencyKeyReused``, ``WatcherLagged``,
    ``LocksWatcherLagged``, ``Refusal``, ``Struct``)
    and left as ``Any`` otherwise; ``reason`` and ``retry_after`` read the first two. ``facts`` is the JSON
    object of the ``berth-error-details`` trailer (the same facts as the Struct detail: ``field`` and
    ``rule`` for INVALID_ARGUMENT, the current seq of a conflict, the holder of a lock...).
    """

    def __init__(self, code: grpc.StatusCode, message: str, details: Sequence[Message] = (), facts: Optional[Mapping[str, Any]] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.details = list(details)
        self.facts: dict = dict(facts or {})

    def detail(self, cls: type) -> Optional[Message]:
        """The first detail of the generated class ``cls`` (e.g. ``lock_service_pb2.LockHeld``), or None."""
        for item in self.details:
            if isinstance(item, cls):
                return item
        return None

    @property
    def reason(self) -> Optional[str]:
        """The case, as the service names it (``SEQ_CONFLICT``, ``WAIT_EXHAUSTED``...): ``google.rpc.ErrorInfo.reason``."""
        info = self.detail(error_details_pb2.ErrorInfo)
        return info.reason if info is not None else None

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds to wait before retrying, when the service says a retry can succeed (``google.rpc.RetryInfo``)."""
        info = self.detail(error_details_pb2.RetryInfo)
        return info.retry_delay.ToTimedelta().total_seconds() if info is not None else None

    @property
    def field(self) -> Optional[str]:
        """For INVALID_ARGUMENT: the request field that was wrong (``session_id``, ``event``...)."""
        value = self.facts.get("field")
        return value if isinstance(value, str) else None


# The detail types berth sends, by their full proto name.
_DETAIL_TYPES: dict = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        struct_pb2.Struct,
        error_details_pb2.ErrorInfo,
        error_details_pb2.RetryInfo,
        error_details_pb2.BadRequest,
        lock_service_pb2.LockHeld,
        lock_service_pb2.LocksWatcherLagged,
        session_service_pb2.SeqConflict,
        session_service_pb2.FenceRejected,
        session_service_pb2.IdempotencyKeyReused,
        session_service_pb2.WatcherLagged,
        budget_pb2.Refusal,
    )
}


def _trailer(call: Any, key: str) -> Optional[Union[str, bytes]]:
    try:
        metadata = call.trailing_metadata() or ()
    except Exception:  # a call that never reached the server has none
        return None
    for item in metadata:
        if item[0] == key:
            return item[1]
    return None


def error_from_rpc(error: grpc.RpcError) -> BerthError:
    """A grpcio error (a failed unary call or stream) as a :class:`BerthError` with decoded details."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = error.details() if hasattr(error, "details") else str(error)
    details: list = []
    raw = _trailer(error, STATUS_DETAILS_TRAILER)
    if isinstance(raw, bytes):
        status = status_pb2.Status.FromString(raw)
        for packed in status.details:
            name = packed.type_url.rsplit("/", 1)[-1]
            cls = _DETAIL_TYPES.get(name)
            if cls is None:
                details.append(any_pb2.Any(type_url=packed.type_url, value=packed.value))
            else:
                details.append(cls.FromString(packed.value))
    facts: dict = {}
    text = _trailer(error, ERROR_DETAILS_TRAILER)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if text:
        try:
            parsed = json.loads(text)
            if isinstance(parsed, dict):
                facts = parsed
        except ValueError:
            pass
    if not facts:
        struct = next((d for d in details if isinstance(d, struct_pb2.Struct)), None)
        if struct is not None:
            facts = json_format.MessageToDict(struct)
    return BerthError(code, message or "", details, facts)


def _rpc(fn: Callable[[], Any]) -> Any:
    """Runs one call, turning a grpcio error into a BerthError."""
    try:
        return fn()
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
