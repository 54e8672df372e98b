"""``Berth``: the channels to both services, and their calls, which each service's module holds
(``sessions``, ``locks``, ``budget``)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .budget import _BudgetCalls
from .connection import _channel, resolve_token, resolve_url
from .errors import _rpc
from .locks import _LockCalls
from .proto import Seconds, budget_service_pb2_grpc, health_pb2, health_pb2_grpc, lock_service_pb2_grpc, session_service_pb2_grpc
from .sessions import _SessionCalls


class Berth(_SessionCalls, _LockCalls, _BudgetCalls):
    """Clients of both berth services.

    The services are found as the berth command finds them (docs/clients.md): ``sessions_url`` and
    ``budget_url`` if given, else ``BERTH_SESSIONS_URL`` / ``BERTH_BUDGET_URL``, else the
    ``BERTH_*_SOCKET``, ``BERTH_HOST`` and ``BERTH_*_PORT`` a service was started with, else
    ``http://127.0.0.1:7301`` / ``:7302`` (see :func:`resolve_url`); the token is ``token``, else the
    contents of ``token_file`` or ``BERTH_TOKEN_FILE``, else ``BERTH_TOKEN`` (:func:`resolve_token`). ``timeout`` bounds unary calls (seconds);
    streams have no deadline unless given one. ``channel_options`` go to grpcio's channels as they are
    (e.g. ``[("grpc.keepalive_time_ms", 20000)]``).
    """

    def __init__(
        self,
        sessions_url: Optional[str] = None,
        budget_url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        timeout: Seconds = 10,
        channel_options: Sequence[tuple] = (),
    ):
        self.sessions_url = resolve_url("sessions", sessions_url)
        self.budget_url = resolve_url("budget", budget_url)
        self.token = resolve_token(token, token_file)  # the bearer token sent on every call (None: none)
        self.timeout = timeout
        self._sessions_channel = _channel(self.sessions_url, self.token, channel_options)
        self._budget_channel = _channel(self.budget_url, self.token, channel_options)
        self.sessions = session_service_pb2_grpc.SessionServiceStub(self._sessions_channel)
        self.locks = lock_service_pb2_grpc.LockServiceStub(self._sessions_channel)
        self.budget = budget_service_pb2_grpc.BudgetServiceStub(self._budget_channel)

    def close(self) -> None:
        self._sessions_channel.close()
        self._budget_channel.close()

    def __enter__(self) -> "Berth":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # health

    def health(self, service: str = "", *, budget: bool = False) -> str:
        """grpc.health.v1 Check of the sessions (or budget) server: "SERVING", "NOT_SERVING"..."""
        channel = self._budget_channel if budget else self._sessions_channel
        stub = health_pb2_grpc.HealthStub(channel)
        response = _rpc(lambda: stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self.timeout))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
