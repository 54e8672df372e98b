"""berth's generated stubs, imported here once for the whole package (the other modules take them
from this one), and what the wrappers share about messages: seconds as a ``Duration``, a message
as JSON."""

from __future__ import annotations

import os
import sys
from typing import Optional, Union


def _stub_dir() -> str:
    # berth_api/ beside the package (examples/python/), not inside it.
    return os.environ.get("BERTH_PYTHON_STUBS") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "berth_api")


# The generated modules import each other as `berth.sessions.v1...`: their root must be on sys.path.
_STUBS = _stub_dir()
if not os.path.isdir(os.path.join(_STUBS, "berth")):
    raise ImportError(f"berth's Python stubs are not in {_STUBS}: run examples/python/generate.sh (or set BERTH_PYTHON_STUBS)")
if _STUBS not in sys.path:
    sys.path.insert(0, _STUBS)

from google.protobuf import duration_pb2, json_format  # noqa: E402
from google.protobuf.message import Message  # noqa: E402

from berth.budget.v1 import budget_pb2, budget_service_pb2, budget_service_pb2_grpc  # noqa: E402
from berth.locks.v1 import lock_service_pb2, lock_service_pb2_grpc  # noqa: E402
from berth.sessions.v1 import events_pb2  # noqa: E402
from berth.sessions.v1 import session_service_pb2, session_service_pb2_grpc, snapshot_pb2  # noqa: E402
import error_details_pb2  # noqa: E402
import health_pb2  # noqa: E402
import status_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402

__all__ = [
    "Seconds",
    "budget_pb2",
    "budget_service_pb2",
    "budget_service_pb2_grpc",
    "error_details_pb2",
    "events_pb2",
    "health_pb2",
    "health_pb2_grpc",
    "lock_service_pb2",
    "lock_service_pb2_grpc",
    "session_service_pb2",
    "session_service_pb2_grpc",
    "snapshot_pb2",
    "status_pb2",
    "to_dict",
]

Seconds = Union[int, float]


def _duration(seconds: Optional[Seconds]) -> Optional[duration_pb2.Duration]:
    if seconds is None:
        return None
    value = duration_pb2.Duration()
    value.FromMilliseconds(int(round(seconds * 1000)))
    return value


def to_dict(message: Message) -> dict:
    """A message as the JSON berth's journal and Connect's JSON use (lowerCamelCase keys)."""
    return json_format.MessageToDict(message)
