"""Where the services are and which token to send, found as the berth command finds them
(docs/clients.md), and the channels that carry the token on every call."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import grpc

DEFAULT_SESSIONS_URL = "http://127.0.0.1:7301"
DEFAULT_BUDGET_URL = "http://127.0.0.1:7302"


# --- the bearer token ------------------------------------------------------------------------


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call, raw stub calls included.

    An interceptor rather than call credentials: grpcio only attaches call credentials on TLS
    channels, and berth on a dev box is plaintext on loopback.
    """

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [m for m in (details.metadata or ()) if m[0] != "authorization"]
        metadata.append(self._header)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials, getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: Optional[float]
    metadata: Optional[Sequence[tuple]]
    credentials: Optional[grpc.CallCredentials]
    wait_for_ready: Optional[bool]
    compression: Optional[grpc.Compression]


# --- finding the services: the same table as the berth command (docs/clients.md) ---------------


def _given(value: Optional[str]) -> Optional[str]:
    """A setting counts when it has more than blanks, as the berth command reads it."""
    return value if value is not None and value.strip() != "" else None


def _server_settings_url(service: str, default_url: str, env: Mapping[str, str]) -> Optional[str]:
    """The URL the service itself would listen on, from the variables that configure it:
    ``BERTH_<SERVICE>_SOCKET``, else ``BERTH_HOST`` and ``BERTH_<SERVICE>_PORT``. An environment set
    up for ``berth up`` (a shell, a compose file, an env file) then works for clients too."""
    socket = _given(env.get(f"BERTH_{service}_SOCKET"))
    if socket is not None:
        return f"unix:{socket}"
    port = _given(env.get(f"BERTH_{service}_PORT"))
    host = _given(env.get("BERTH_HOST"))
    if port is None and host is None:
        return None
    # A service listening on every address is reached on loopback.
    if host is None or host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port if port is not None else default_url.rsplit(':', 1)[1]}"


def resolve_url(service: str, url: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> str:
    """Where ``service`` (``"sessions"`` or ``"budget"``) is: ``url`` if given, else
    ``BERTH_<SERVICE>_URL``, else ``unix:$BERTH_<SERVICE>_SOCKET``, else ``BERTH_HOST`` (0.0.0.0 and
    :: meaning 127.0.0.1) with ``BERTH_<SERVICE>_PORT`` (either alone takes the other's default),
    else ``http://127.0.0.1:7301`` / ``:7302``. ValueError for anything but ``http(s)://HOST…`` or
    ``unix:PATH``."""
    env = os.environ if env is None else env
    name = service.upper()
    default_url = {"SESSIONS": DEFAULT_SESSIONS_URL, "BUDGET": DEFAULT_BUDGET_URL}[name]
    url_env = f"BERTH_{name}_URL"
    resolved = _given(url) or _given(env.get(url_env)) or _server_settings_url(name, default_url, env) or default_url
    if not re.match(r"^https?://[^/]+", resolved) and not re.match(r"^unix:.+", resolved):
        raise ValueError(f"{'the URL' if url is not None else url_env} must look like http://127.0.0.1:7301 or unix:/path/to/socket, got {json.dumps(resolved)}")
    return re.sub(r"/+$", "", resolved)


def resolve_token(token: Optional[str] = None, token_file: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The bearer token: ``token`` if given, else the contents of ``token_file``, else of
    ``BERTH_TOKEN_FILE``, else ``BERTH_TOKEN``; None without one. ValueError for a token file that
    cannot be read or is empty."""
    env = os.environ if env is None else env
    if _given(token) is not None:
        return token
    path = _given(token_file) or _given(env.get("BERTH_TOKEN_FILE"))
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
        except OSError as error:
            raise ValueError(f"cannot read the token file {path}: {error.strerror or error}") from error
        if not value:
            raise ValueError(f"the token file {path} is empty")
        return value
    return _given(env.get("BERTH_TOKEN"))


def _target(url: str) -> str:
    """A resolved URL (``http://127.0.0.1:7301``, ``unix:/path``) → grpcio's target."""
    if url.startswith("unix:"):
        return url
    if url.startswith("https://"):
        raise ValueError("berth serves plaintext on loopback: use http://HOST:PORT (or put TLS in a proxy and adapt _channel)")
    return url[len("http://") :]


def _channel(url: str, token: Optional[str], options: Sequence[tuple] = ()) -> grpc.Channel:
    # No HTTP proxy: berth is on this machine, and an http_proxy variable must not reroute it.
    channel = grpc.insecure_channel(_target(url), options=[("grpc.enable_http_proxy", 0), *options])
    return grpc.intercept_channel(channel, _BearerToken(token)) if token else channel
