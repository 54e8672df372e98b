"""A small Python client of berth's sessions, locks and budget services.

It wraps the stubs that `generate.sh` makes from berth's protos (plain grpcio, nothing else) with
the few patterns that take care to get right by hand:

- append events (an append another process's line overtook is made again, as the service asks)
  and read them back; list every session, page by page; delete one; watch a session (backlog, the
  caught-up marker, live entries, progress while idle) or every session, resuming by itself when
  the service ends a watcher that fell behind (a watch of every session resumes from the last seq
  it saw of each, so only what changed is described again);
- hold a source lock for the length of a ``with`` block (the Hold stream: the lock is freed the
  instant the stream ends, even if this process is killed), or take one as a lease (Acquire, with a
  request id that makes a retry safe; unary KeepAlive; Release), a relative path resolved against
  this process's working directory, as the service wants absolute paths;
- admit work with the Admit stream (queued updates to a callback, then admitted; report started
  services; release), or with a lease (Reserve, KeepAlive, Release) where a stream cannot be held,
  a ``request_id`` making a retried Reserve or RegisterRunning safe; read the budget's lists page
  by page;
- watch the locks of one file or every file, the budget (queue, reservations, running tally,
  policy) and the machine's samples, from a revision if given, with progress while idle, resuming
  by themselves from the revision the service names when it ends a watcher that fell behind (a
  ``caught_up`` with ``reset`` tells the caller to replace its view, when the changes missed are
  no longer held);
- the bearer token on every call, and errors with their structured details decoded.

Everything else is reachable through the raw stubs: ``client.sessions``, ``client.locks`` and
``client.budget``.

    from berth_client import Berth, start

    with Berth() as berth:                              # found as the berth command finds them (docs/clients.md)
        berth.append("demo", "generate", {"pageUrl": "/", "count": 3})
        with berth.lock("src/app.css", owner="me", max_wait=30) as lease:
            print("holding, fencing token", lease.fencing_token)
        with berth.admit([start("web", memory="1G")], owner="my-tool up web") as admission:
            admission.started("web", pid=os.getpid())
        for message in berth.watch_locks("src/app.css", include_current=True):
            print(message)

The stubs are imported from the folder named by ``BERTH_PYTHON_STUBS``, else from ``berth_api``
beside this file (where ``generate.sh`` puts them by default).
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import grpc


def _stub_dir() -> str:
    return os.environ.get("BERTH_PYTHON_STUBS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "berth_api")


# The generated modules import each other as `berth.sessions.v1...`: their root must be on sys.path.
_STUBS = _stub_dir()
if not os.path.isdir(os.path.join(_STUBS, "berth")):
    raise ImportError(f"berth's Python stubs are not in {_STUBS}: run examples/python/generate.sh (or set BERTH_PYTHON_STUBS)")
if _STUBS not in sys.path:
    sys.path.insert(0, _STUBS)

from google.protobuf import any_pb2, json_format, struct_pb2  # noqa: E402
from google.protobuf import duration_pb2  # noqa: E402
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
    "Admission",
    "Berth",
    "BerthError",
    "BudgetWatch",
    "HeldLock",
    "LockLease",
    "LocksWatch",
    "MachineWatch",
    "Reservation",
    "JournalRead",
    "SessionWatch",
    "SessionsWatch",
    "WatchEvent",
    "appliance",
    "build",
    "error_from_rpc",
    "event",
    "resolve_token",
    "resolve_url",
    "start",
    "to_dict",
]

DEFAULT_SESSIONS_URL = "http://127.0.0.1:7301"
DEFAULT_BUDGET_URL = "http://127.0.0.1:7302"

# The trailer in which berth repeats an error's details as JSON (see ERROR_DETAILS_HEADER in
# packages/shared/src/server/connect-errors.ts), for clients that do not decode the binary one.
ERROR_DETAILS_TRAILER = "berth-error-details"
# The standard gRPC trailer holding a serialized google.rpc.Status with typed details.
STATUS_DETAILS_TRAILER = "grpc-status-details-bin"

Seconds = Union[int, float]


# --- errors ----------------------------------------------------------------------------------


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


# An append another process's line overtook left nothing behind: it is made again, this many times in all.
_OVERTAKEN_ATTEMPTS = 5


def _append_retrying(fn: Callable[[], Any]) -> Any:
    """Runs an append, making it again when the service refused it as overtaken (UNAVAILABLE
    ``APPEND_OVERTAKEN``), after the delay its RetryInfo asks."""
    for attempt in range(1, _OVERTAKEN_ATTEMPTS + 1):
        try:
            return _rpc(fn)
        except BerthError as error:
            if error.reason != "APPEND_OVERTAKEN" or attempt == _OVERTAKEN_ATTEMPTS:
                raise
            time.sleep(min(1.0, error.retry_after or 0.01))
    raise AssertionError("unreachable")


_EXPECTED_STATES = {
    "any": session_service_pb2.EXPECTED_STATE_ANY,
    "no_session": session_service_pb2.EXPECTED_STATE_NO_SESSION,
    "exists": session_service_pb2.EXPECTED_STATE_EXISTS,
}


def _expect(request: Any, expected_seq: Optional[int], expected_state: Optional[str]) -> None:
    """Sets an append's expectation: a seq (0: no entry yet, which the service takes as the state
    NO_SESSION) or a state by name."""
    if expected_seq is not None and expected_state is not None:
        raise ValueError("give expected_seq or expected_state, not both")
    if expected_seq == 0:
        expected_state = "no_session"
    elif expected_seq is not None:
        request.expected_seq = expected_seq
    if expected_state is not None:
        if expected_state not in _EXPECTED_STATES:
            raise ValueError(f"expected_state must be one of {', '.join(_EXPECTED_STATES)}, got {expected_state!r}")
        request.expected_state = _EXPECTED_STATES[expected_state]


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


# --- request helpers -------------------------------------------------------------------------


def lock_path(file: Union[str, "os.PathLike[str]"]) -> str:
    """A lock path made absolute against this process's working directory, as every lock call sends it.

    The service refuses a relative path (INVALID_ARGUMENT naming ``file``): only the client knows
    the directory it is relative to. Joined, not normalised: the service resolves ``..`` as the
    kernel does (after a symlinked directory it is the target's parent) and answers with the
    canonical path, which is the same for every spelling of one file.
    """
    file = os.fspath(file)
    return file if os.path.isabs(file) else os.path.join(os.getcwd(), file)


def _duration(seconds: Optional[Seconds]) -> Optional[duration_pb2.Duration]:
    if seconds is None:
        return None
    value = duration_pb2.Duration()
    value.FromMilliseconds(int(round(seconds * 1000)))
    return value


def _watch_request(request: Message, progress_interval: Optional[Seconds]) -> Message:
    """A watch's request, asking for a ``progress`` message whenever ``progress_interval`` seconds
    pass quietly (None: never)."""
    if progress_interval is not None:
        request.progress_interval.CopyFrom(_duration(progress_interval))
    return request


def event(type: str, fields: Optional[Mapping[str, Any]] = None, *, extra: Optional[Mapping[str, Any]] = None) -> events_pb2.Event:
    """An Event from its journal type and keys, as the journal writes them.

    ``event("generate", {"pageUrl": "/", "count": 3})``; keys are the proto3 JSON names (the seed's
    keys) or the proto field names. ``extra`` holds keys the typed event does not have. A type berth
    does not know becomes an ``OtherEvent`` with ``fields`` (and ``extra``) as its keys.
    """
    fields = dict(fields or {})
    oneof = events_pb2.Event.DESCRIPTOR.oneofs_by_name["kind"]
    known = {f.name for f in oneof.fields if f.name != "other"}
    if type in known:
        body = dict(fields)
        if extra:
            body["extra"] = dict(extra)
        return json_format.ParseDict({type: body}, events_pb2.Event())
    return json_format.ParseDict({"other": {"type": type, "fields": {**fields, **dict(extra or {})}}}, events_pb2.Event())


def _item(kind: int, name: str, memory: Optional[str], cpu: Optional[float], wave: Optional[int] = None, skipped: Optional[str] = None) -> budget_pb2.NeedItem:
    item = budget_pb2.NeedItem(kind=kind, name=name)
    # The service costs a build by the spec's build part and anything else by its run part.
    spec = item.spec.build if kind == budget_pb2.NEED_ITEM_KIND_BUILD else item.spec
    if memory is not None:
        spec.memory = str(memory)
    if cpu is not None:
        spec.cpu = float(cpu)
    if wave is not None:
        item.wave = wave
    if skipped is not None:
        item.skipped = skipped
    return item


def start(name: str, memory: Optional[str] = None, cpu: Optional[float] = None) -> budget_pb2.NeedItem:
    """A service start (held until reported started or released). ``memory`` like ``"512M"``; unset parts take the policy's default."""
    return _item(budget_pb2.NEED_ITEM_KIND_START, name, memory, cpu)


def appliance(name: str, memory: Optional[str] = None, cpu: Optional[float] = None) -> budget_pb2.NeedItem:
    """An appliance start (a database, a queue...), counted like a start."""
    return _item(budget_pb2.NEED_ITEM_KIND_APPLIANCE, name, memory, cpu)


def build(name: str, memory: Optional[str] = None, cpu: Optional[float] = None, wave: Optional[int] = None, skipped: Optional[str] = None) -> budget_pb2.NeedItem:
    """A build (held only while building; builds of one ``wave`` add up)."""
    return _item(budget_pb2.NEED_ITEM_KIND_BUILD, name, memory, cpu, wave, skipped)


def _need(items: Union[budget_pb2.Need, Iterable[budget_pb2.NeedItem]]) -> budget_pb2.Need:
    return items if isinstance(items, budget_pb2.Need) else budget_pb2.Need(items=list(items))


class _Requests:
    """The request side of a client stream: an iterator grpcio drains on its own thread."""

    _END = object()

    def __init__(self, first: Optional[Message] = None):
        self._queue: "queue.Queue[Any]" = queue.Queue()
        if first is not None:
            self._queue.put(first)

    def send(self, message: Message) -> None:
        self._queue.put(message)

    def close(self) -> None:
        """Half-closes the stream (no more requests)."""
        self._queue.put(self._END)

    def __iter__(self) -> Iterator[Message]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            yield item


# --- sessions --------------------------------------------------------------------------------


@dataclass
class WatchEvent:
    """One item of a session watch: a journal ``entry`` (backlog before ``caught_up``, live after,
    with the ``snapshot`` it produced when asked for), the ``caught_up`` marker (with the snapshot as
    of it), or ``progress`` (nothing new for the progress interval; ``progress.last_seq`` is the seq
    of the session's last entry, all of which were sent)."""

    entry: Optional[session_service_pb2.JournalEntry] = None
    caught_up: Optional[session_service_pb2.CaughtUp] = None
    progress: Optional[session_service_pb2.WatchProgress] = None
    snapshot: Optional[snapshot_pb2.Snapshot] = None
    live: bool = False
    resumed: bool = False

    @property
    def seq(self) -> int:
        return self.entry.seq if self.entry is not None else 0


def _lagged(error: grpc.RpcError) -> "tuple[BerthError, Optional[session_service_pb2.WatcherLagged]]":
    failure = error_from_rpc(error)
    lagged = failure.detail(session_service_pb2.WatcherLagged) if failure.reason == "WATCHER_LAGGED" else None
    return failure, lagged


class SessionWatch:
    """A WatchSession stream as an iterator of :class:`WatchEvent`, one per entry (the service sends
    several entries to a message: the backlog up to 100 at a time, live ones with ``max_batch``);
    ``cancel()`` (or leaving a ``with``) ends it.

    When the service ends the watch because this client fell behind (RESOURCE_EXHAUSTED
    WATCHER_LAGGED, with a ``WatcherLagged`` detail) and ``resume_on_lag`` is set, it watches again
    from the detail's ``resume_from_seq``: no entry is missed, and a second ``caught_up`` marks the
    new backlog's end. A deleted session ends the watch with BerthError NOT_FOUND (reason
    ``SESSION_DELETED``).
    """

    def __init__(
        self,
        stub: session_service_pb2_grpc.SessionServiceStub,
        session_id: str,
        from_seq: int,
        include_snapshot: bool,
        resume_on_lag: bool,
        timeout: Optional[Seconds],
        max_batch: int = 0,
        progress_interval: Optional[Seconds] = None,
    ):
        self._stub = stub
        self._session_id = session_id
        self._include_snapshot = include_snapshot
        self._resume_on_lag = resume_on_lag
        self._timeout = timeout
        self._max_batch = max_batch
        self._progress_interval = progress_interval
        self._next_seq = max(from_seq, 1)
        self._live = False
        self._cancelled = False
        self._resumed = False
        self._pending: "list[WatchEvent]" = []
        self._call = self._open()

    def _open(self):
        request = session_service_pb2.WatchSessionRequest(session_id=self._session_id, from_seq=self._next_seq, include_snapshot=self._include_snapshot, max_batch=self._max_batch)
        self._live = False
        return self._stub.WatchSession(_watch_request(request, self._progress_interval), timeout=self._timeout)

    def __iter__(self) -> "SessionWatch":
        return self

    def __next__(self) -> WatchEvent:
        while not self._pending:
            try:
                message = next(self._call)
            except grpc.RpcError as error:
                if self._cancelled and error.code() == grpc.StatusCode.CANCELLED:
                    raise StopIteration from None
                failure, lagged = _lagged(error)
                if self._resume_on_lag and lagged is not None:
                    self._next_seq = lagged.resume_from_seq
                    self._resumed = True
                    self._call = self._open()
                    continue
                raise failure from None
            kind = message.WhichOneof("kind")
            if kind == "caught_up":
                self._live = True
                caught = message.caught_up
                self._pending.append(WatchEvent(caught_up=caught, snapshot=caught.snapshot if caught.HasField("snapshot") else None))
            elif kind == "progress":
                self._pending.append(WatchEvent(progress=message.progress, live=self._live))
            elif kind == "entries":
                for watched in message.entries.entries:
                    self._next_seq = watched.entry.seq + 1
                    snapshot = watched.snapshot if watched.HasField("snapshot") else None
                    self._pending.append(WatchEvent(entry=watched.entry, snapshot=snapshot, live=self._live))
            if self._pending and self._resumed:
                self._pending[0].resumed = True
                self._resumed = False
        return self._pending.pop(0)

    def cancel(self) -> None:
        """Ends the watch (the service frees the watcher at once)."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> "SessionWatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()


class _RevisionWatch:
    """What the watches numbered by revision share (every session, the locks, the budget, the
    machine): the stream ``method`` starts with ``request``, as an iterator of its messages;
    ``cancel()`` (or leaving a ``with``) ends it.

    ``revision`` is the revision up to which every change was seen, taken from each change, each
    ``caught_up`` and each ``progress`` (a ``reset`` caught-up's even when it is lower: a new run's
    may be). When the service ends the stream because this client fell behind (RESOURCE_EXHAUSTED
    ``WATCHER_LAGGED``) and ``resume_on_lag`` is set, it watches again from the revision the error
    names, the last one the service handed on whole: the service replays what followed, then
    ``caught_up``, so every change comes through once and none is missed; when it can no longer
    replay them, the ``caught_up`` after the current state says ``reset``, and the caller replaces
    its view with that state. ``resumes`` counts how often that happened.
    """

    def __init__(self, method: Callable[..., Any], request: Message, resume_on_lag: bool, timeout: Optional[Seconds]):
        self._method = method
        self._request = request
        self.revision = request.start_revision
        self.resumes = 0
        self._resume_on_lag = resume_on_lag
        self._timeout = timeout
        self._cancelled = False
        self._resumed_from: Optional[int] = None
        self._taken_since_resume = False
        self._call = self._open(resume=False)

    def _request_for(self, resume: bool) -> Message:
        """The request that starts the stream: from ``revision``; a resume does not ask for the
        current state again (WatchBudget would let it win over ``start_revision``)."""
        request = type(self._request)()
        request.CopyFrom(self._request)
        request.start_revision = self.revision
        if resume:
            request.include_current = False
        return request

    def _open(self, resume: bool) -> Any:
        return self._method(self._request_for(resume), timeout=self._timeout)

    def _resume_revision(self, failure: BerthError) -> Optional[int]:
        """The revision a WATCHER_LAGGED error names to watch again from (None: not resumable)."""
        return None

    def _seen(self, revision: int, reset: bool = False) -> None:
        if reset or revision > self.revision:
            self.revision = revision

    def _took(self, message: Message) -> None:
        """Keeps the revision of a message whose ``kind`` (a change or event, ``caught_up``,
        ``progress``) carries one."""
        kind = message.WhichOneof("kind")
        if kind is not None:
            part = getattr(message, kind)
            self._seen(part.revision, kind == "caught_up" and part.reset)

    def __iter__(self) -> "_RevisionWatch":
        return self

    def __next__(self) -> Any:
        while True:
            try:
                message = next(self._call)
            except grpc.RpcError as error:
                if self._cancelled and error.code() == grpc.StatusCode.CANCELLED:
                    raise StopIteration from None
                failure = error_from_rpc(error)
                resume_from = self._resume_revision(failure) if self._resume_on_lag and failure.reason == "WATCHER_LAGGED" else None
                # A resumed stream ended lagged again before handing on anything, from the same
                # revision: the service cannot replay it to this client, and resuming again would spin.
                if resume_from is None or (self._resumed_from == resume_from and not self._taken_since_resume):
                    raise failure from None
                self.revision = self._resumed_from = resume_from
                self._taken_since_resume = False
                self.resumes += 1
                self._call = self._open(resume=True)
                if self._cancelled:  # cancelled from another thread while this one resumed
                    self._call.cancel()
                continue
            self._taken_since_resume = True
            self._took(message)
            return message

    def cancel(self) -> None:
        """Ends the watch (the service frees the watcher at once)."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cancel()


class SessionsWatch(_RevisionWatch):
    """A WatchSessions stream as an iterator of its messages (``change``, ``caught_up``, ``progress``:
    ``message.WhichOneof("kind")``); ``cancel()`` (or leaving a ``with``) ends it.

    ``last_seqs`` holds the last seq seen of each session (a deleted one is dropped), and
    ``revision`` the revision up to which every change was seen: a watch started again later with
    ``start_revision=revision`` and ``resume_from=last_seqs`` gets exactly the changes since (or,
    when the service no longer holds them, a reset describing only what moved). When the service ends the watch
    because this client fell behind (WATCHER_LAGGED) and ``resume_on_lag`` is set, it watches again
    with ``start_revision`` set to the revision the error's ``WatcherLagged`` names and
    ``resume_from = last_seqs``: the service replays exactly the changes missed, deletions included
    (on etcd, a transaction it lagged part way through is sent again whole), then ``caught_up``,
    and goes on live; when it can no longer replay them (its ``caught_up`` then says ``reset``) it
    describes only the sessions that moved since ``last_seqs`` and names the deleted ones.
    ``resumes`` counts how often that happened.
    """

    def __init__(
        self,
        stub: session_service_pb2_grpc.SessionServiceStub,
        *,
        include_current: bool,
        include_snapshot: bool,
        include_completed: bool,
        resume_on_lag: bool,
        progress_interval: Optional[Seconds],
        timeout: Optional[Seconds],
        start_revision: int = 0,
        resume_from: Optional[Mapping[str, int]] = None,
    ):
        self.last_seqs: dict = dict(resume_from or {})
        request = session_service_pb2.WatchSessionsRequest(
            include_current=include_current, include_snapshot=include_snapshot, include_completed=include_completed, start_revision=start_revision
        )
        super().__init__(stub.WatchSessions, _watch_request(request, progress_interval), resume_on_lag, timeout)

    def _request_for(self, resume: bool) -> Message:
        request = super()._request_for(resume)
        # The seqs as they stand now (a session deleted since is no longer among them).
        request.resume_from.clear()
        request.resume_from.update(self.last_seqs)
        return request

    def _resume_revision(self, failure: BerthError) -> Optional[int]:
        lagged = failure.detail(session_service_pb2.WatcherLagged)
        return lagged.resume_from_revision if lagged is not None else None

    def _took(self, message: session_service_pb2.WatchSessionsResponse) -> None:
        kind = message.WhichOneof("kind")
        if kind == "change":
            change = message.change
            if change.deleted:
                self.last_seqs.pop(change.session_id, None)
            else:
                self.last_seqs[change.session_id] = change.last_seq
        elif kind == "caught_up":
            for session_id in message.caught_up.deleted:
                self.last_seqs.pop(session_id, None)
        super()._took(message)


@dataclass
class JournalRead:
    """What :meth:`Berth.read_journal` read: the ``entries`` (iterate over it, or ``len()``), and where
    the read ended: ``last_seq`` (the session's last entry then), ``next_seq`` (the ``from_seq`` that
    continues it) and ``more`` (true when ``limit`` stopped it before the end)."""

    entries: list
    last_seq: int
    next_seq: int
    more: bool

    def __iter__(self) -> Iterator[session_service_pb2.JournalEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


# --- locks -----------------------------------------------------------------------------------


class HeldLock:
    """A source lock held by a Hold stream, for a ``with`` block: see :meth:`Berth.lock`.

    Entering waits until the lock is granted and returns the ``Lease`` (``fencing_token``, ``file``,
    ``owner``...). Leaving ends the stream, which frees the lock. ``lost`` becomes true if the stream
    ended by itself while held (the service shut down, the connection broke): the lock is then no
    longer held, and the fencing token must not be used any more.
    """

    def __init__(self, stub: lock_service_pb2_grpc.LockServiceStub, request: lock_service_pb2.HoldRequest, on_waiting: Optional[Callable[[lock_service_pb2.Waiting], None]]):
        self._stub = stub
        self._request = request
        self._on_waiting = on_waiting
        self._call = None
        self._thread: Optional[threading.Thread] = None
        self._released = False
        self.lease: Optional[lock_service_pb2.Lease] = None
        self.lost = False
        self.lost_error: Optional[BerthError] = None
        self.heartbeats = 0

    def __enter__(self) -> lock_service_pb2.Lease:
        self._call = self._stub.Hold(self._request)
        try:
            for message in self._call:
                if message.HasField("waiting"):
                    if self._on_waiting:
                        self._on_waiting(message.waiting)
                elif message.HasField("acquired"):
                    self.lease = message.acquired
                    break
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        except BaseException:
            # Ctrl-C while queued: ending the stream withdraws from the queue.
            self._call.cancel()
            raise
        if self.lease is None:
            raise BerthError(grpc.StatusCode.UNAVAILABLE, "the Hold stream ended before the lock was granted")
        # Heartbeats keep coming while the lock is held; reading them tells a lost lock at once.
        self._thread = threading.Thread(target=self._drain, name="berth-hold", daemon=True)
        self._thread.start()
        return self.lease

    def _drain(self) -> None:
        try:
            for message in self._call:
                if message.HasField("heartbeat"):
                    self.heartbeats += 1
            if not self._released:
                self.lost = True
        except grpc.RpcError as error:
            if not self._released:
                self.lost = True
                self.lost_error = error_from_rpc(error)

    def wait_lost(self, timeout: Optional[Seconds] = None) -> bool:
        """Blocks until the lock is lost (the stream ended by itself: ``lost_error`` says why when the
        service ended it with an error, e.g. reason ``SHUTTING_DOWN``; it is None when the stream ended
        OK, its lease released through Release with its token) or ``timeout`` passes; True when it was
        lost."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.lost

    def release(self) -> None:
        """Ends the stream: the service frees the lock (and hands it to the next waiter)."""
        if self._released or self._call is None:
            return
        self._released = True
        self._call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __exit__(self, *exc: Any) -> None:
        self.release()


class LockLease:
    """A lease from Acquire: renew it with :meth:`keep_alive` (or :meth:`start_keep_alive`), free it
    with :meth:`release` (or a ``with`` block)."""

    def __init__(self, stub: lock_service_pb2_grpc.LockServiceStub, lease: lock_service_pb2.Lease, timeout: Seconds):
        self._stub = stub
        self.lease = lease
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def fencing_token(self) -> int:
        return self.lease.fencing_token

    def keep_alive(self) -> lock_service_pb2.Renewal:
        """Renews the lease once for its ttl (unary KeepAlive); ``alive`` is False when it is gone."""
        request = lock_service_pb2.KeepAliveRequest(lease_tokens=[self.lease.lease_token])
        return _rpc(lambda: self._stub.KeepAlive(request, timeout=self._timeout)).renewals[0]

    def start_keep_alive(self, every: Optional[Seconds] = None) -> None:
        """Renews from a background thread (every third of the ttl by default) until released or gone."""
        if self._thread is not None:
            return
        ttl = self.lease.ttl.ToMilliseconds() / 1000 if self.lease.HasField("ttl") else 30
        interval = every if every is not None else max(ttl / 3, 0.1)

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    if not self.keep_alive().alive:
                        return
                except BerthError:
                    pass  # transient: the next tick tries again before the lease runs out

        self._thread = threading.Thread(target=run, name="berth-lock-keepalive", daemon=True)
        self._thread.start()

    def release(self) -> bool:
        """Frees the lease; False when it was already gone."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return _rpc(lambda: self._stub.Release(lock_service_pb2.ReleaseRequest(lease_token=self.lease.lease_token), timeout=self._timeout)).released

    def __enter__(self) -> "LockLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class LocksWatch(_RevisionWatch):
    """A WatchLocks stream (see :meth:`Berth.watch_locks`) as an iterator of its messages: ``event``
    (a ``LockEvent``: granted, released, expired, a waiter joining or leaving; before ``caught_up``,
    the current holders and waiters), ``caught_up`` and ``progress`` (``message.WhichOneof("kind")``).
    ``revision`` and resuming after WATCHER_LAGGED (from the error's ``LocksWatcherLagged``) as
    :class:`_RevisionWatch` says; ``cancel()`` (or leaving a ``with``) ends it."""

    def _resume_revision(self, failure: BerthError) -> Optional[int]:
        lagged = failure.detail(lock_service_pb2.LocksWatcherLagged)
        return lagged.resume_from_revision if lagged is not None else None


# --- budget ----------------------------------------------------------------------------------


class Admission:
    """An Admit stream: see :meth:`Berth.admit`.

    Entering (or :meth:`wait`) sends the need and blocks until admitted, calling ``on_queued`` with
    each ``Queued`` update (position, eta, what it waits for). Then :meth:`build_done`,
    :meth:`started` and :meth:`release` talk on the same stream. Leaving the ``with`` block releases
    (and if anything went wrong, ends the stream, which releases too).
    """

    def __init__(self, stub: budget_service_pb2_grpc.BudgetServiceStub, start_request: budget_service_pb2.AdmitStart, on_queued: Optional[Callable[[budget_service_pb2.Queued], None]], timeout: Optional[Seconds]):
        self._stub = stub
        self._start = start_request
        self._on_queued = on_queued
        self._timeout = timeout
        self._requests: Optional[_Requests] = None
        self._call = None
        self.admitted: Optional[budget_service_pb2.Admitted] = None
        self.queued: list = []
        self.released = False

    @property
    def reservation(self) -> budget_pb2.Reservation:
        assert self.admitted is not None, "not admitted yet"
        return self.admitted.reservation

    def _next(self) -> budget_service_pb2.AdmitResponse:
        try:
            return next(self._call)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def wait(self) -> budget_service_pb2.Admitted:
        """Sends the need and waits to be admitted (refusals raise BerthError with a ``Refusal`` detail)."""
        self._requests = _Requests(budget_service_pb2.AdmitRequest(start=self._start))
        self._call = self._stub.Admit(iter(self._requests), timeout=self._timeout)
        try:
            while True:
                response = self._next()
                if response.HasField("queued"):
                    self.queued.append(response.queued)
                    if self._on_queued:
                        self._on_queued(response.queued)
                elif response.HasField("admitted"):
                    self.admitted = response.admitted
                    return self.admitted
        except BaseException:
            self._call.cancel()
            raise

    def _exchange(self, request: budget_service_pb2.AdmitRequest, answer: str) -> Any:
        assert self._requests is not None and self.admitted is not None, "not admitted yet"
        self._requests.send(request)
        while True:
            response = self._next()
            if response.HasField(answer):
                return getattr(response, answer)

    def build_done(self) -> budget_pb2.Reservation:
        """The build phase is over: its share goes back. Returns the reservation as it stands."""
        return self._exchange(budget_service_pb2.AdmitRequest(build_done=budget_service_pb2.BuildDone()), "updated").reservation

    def started(self, name: str, *, pid: Optional[int] = None, memory: Optional[str] = None, cpu: Optional[float] = None, ttl: Optional[Seconds] = None) -> budget_service_pb2.ReservationUpdated:
        """A service of this admission now runs: its cost moves to the running tally, which keeps it
        after this stream ends, until ``pid`` exits (or its ``ttl`` lease or StopRunning ends it).
        Its cost is ``memory``/``cpu`` where given, else what the need's item of the same name was
        admitted with."""
        started = budget_service_pb2.Started(name=name)
        if memory is not None or cpu is not None:
            if memory is not None:
                started.spec.memory = str(memory)
            if cpu is not None:
                started.spec.cpu = float(cpu)
        if pid is not None:
            started.pid = pid
        if ttl is not None:
            started.ttl.CopyFrom(_duration(ttl))
        return self._exchange(budget_service_pb2.AdmitRequest(started=started), "updated")

    def release(self) -> str:
        """Releases the reservation; the service answers and ends the stream. Returns its id."""
        if self.released:
            return self.reservation.id
        released = self._exchange(budget_service_pb2.AdmitRequest(release=budget_service_pb2.ReleaseReservation()), "released")
        self.released = True
        self._requests.close()
        return released.reservation_id

    def cancel(self) -> None:
        """Ends the stream without a word: the service releases the reservation (or drops the queued request)."""
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> "Admission":
        self.wait()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None and not self.released:
            try:
                self.release()
                return
            except BerthError:
                pass
        self.cancel()


class Reservation:
    """A reservation from Reserve, alive until :meth:`release` or until its lease runs out.

    :meth:`keep_alive` renews it once; ``auto_keep_alive`` (or :meth:`start_keep_alive`) renews it
    from a thread every third of its ttl. A ``with`` block releases it at the end.
    """

    def __init__(self, stub: budget_service_pb2_grpc.BudgetServiceStub, response: budget_service_pb2.ReserveResponse, ttl: Optional[Seconds], timeout: Seconds):
        self._stub = stub
        self.response = response
        self._ttl = ttl
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.renewals: list = []

    @property
    def id(self) -> str:
        return self.response.reservation.id

    @property
    def reservation(self) -> budget_pb2.Reservation:
        return self.response.reservation

    def keep_alive(self) -> budget_service_pb2.Renewal:
        """Renews the lease for its ttl; ``alive`` is False when the reservation is gone."""
        response = _rpc(lambda: self._stub.KeepAlive(budget_service_pb2.KeepAliveRequest(ids=[self.id]), timeout=self._timeout))
        renewal = response.renewals[0]
        self.renewals.append(renewal)
        return renewal

    def start_keep_alive(self, every: Optional[Seconds] = None) -> None:
        """Renews from a background thread (every third of the ttl by default) until released."""
        if self._thread is not None:
            return
        expires = self.reservation.expire_time.ToMilliseconds() if self.reservation.HasField("expire_time") else 0
        admitted = self.reservation.admit_time.ToMilliseconds() if self.reservation.HasField("admit_time") else 0
        interval = every if every is not None else max(((self._ttl or (expires - admitted) / 1000) or 30) / 3, 0.1)

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    if not self.keep_alive().alive:
                        return
                except BerthError:
                    pass  # transient: the next tick tries again before the lease runs out

        self._thread = threading.Thread(target=run, name="berth-keepalive", daemon=True)
        self._thread.start()

    def release(self) -> bool:
        """Releases it; False when it was already gone (released or expired)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return _rpc(lambda: self._stub.Release(budget_service_pb2.ReleaseRequest(reservation_id=self.id), timeout=self._timeout)).released

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class BudgetWatch(_RevisionWatch):
    """A WatchBudget stream (see :meth:`Berth.watch_budget`) as an iterator of its messages:
    ``event`` (a ``BudgetEvent``: the queue, reservations, the running tally, the policy; before
    ``caught_up``, the current state), ``caught_up`` and ``progress``
    (``message.WhichOneof("kind")``). ``revision`` and resuming after WATCHER_LAGGED (from the
    ``resumeRevision`` of the error's ErrorInfo metadata) as :class:`_RevisionWatch` says;
    ``cancel()`` (or leaving a ``with``) ends it."""

    def _resume_revision(self, failure: BerthError) -> Optional[int]:
        info = failure.detail(error_details_pb2.ErrorInfo)
        revision = info.metadata.get("resumeRevision", "") if info is not None else ""
        return int(revision) if revision.isdigit() else None


class MachineWatch(_RevisionWatch):
    """A WatchMachine stream (see :meth:`Berth.watch_machine`) as an iterator of its messages: a
    ``machine`` sample with its ``revision`` (``reset`` when ``start_revision`` could not be
    continued: samples between were missed), or ``progress`` when no sample came for the progress
    interval (``message.HasField("progress")``). ``revision`` is the last sample's: watching again
    with ``start_revision=revision`` continues after it. Samples are states, not changes: a client
    slower than the sampler gets the latest one (its revision shows how many it skipped), so the
    service never ends this watch for lagging. ``cancel()`` (or leaving a ``with``) ends it."""

    def _took(self, message: budget_service_pb2.WatchMachineResponse) -> None:
        self._seen(message.revision, message.reset)


# --- the client ------------------------------------------------------------------------------


class Berth:
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

    # sessions

    def append(
        self,
        session_id: str,
        type_or_event: Union[str, events_pb2.Event],
        fields: Optional[Mapping[str, Any]] = None,
        *,
        extra: Optional[Mapping[str, Any]] = None,
        expected_seq: Optional[int] = None,
        expected_state: Optional[str] = None,
        idempotency_key: str = "",
        fence: Optional[tuple] = None,
    ) -> session_service_pb2.AppendEventResponse:
        """Appends one event (``"generate", {"pageUrl": "/"}`` or an ``Event``); returns its seq and the snapshot.

        ``expected_seq``: refused with ABORTED ``SEQ_CONFLICT`` (detail ``SeqConflict``: re-read,
        redo, retry) unless it is the session's last seq; 0 means "no entry yet". ``expected_state``:
        ``"no_session"`` or ``"exists"``, refused the same way when the session is not so.
        ``idempotency_key``: a retry with the same event writes nothing and answers the first result;
        the key with another event is refused (ALREADY_EXISTS ``IDEMPOTENCY_KEY_REUSED``).
        ``fence=(file, fencing_token)``: refused (FAILED_PRECONDITION ``FENCE_REJECTED``,
        ``FenceRejected``: acquire the lock again) once that lock moved on; ``file`` in any spelling
        (relative to this process's working directory, or the lease's ``file``). An append another
        process's line overtook (UNAVAILABLE ``APPEND_OVERTAKEN``; nothing of it was kept) is made
        again after the delay the service asks, a few times.
        """
        ev = type_or_event if isinstance(type_or_event, events_pb2.Event) else event(type_or_event, fields, extra=extra)
        request = session_service_pb2.AppendEventRequest(session_id=session_id, event=ev, idempotency_key=idempotency_key)
        _expect(request, expected_seq, expected_state)
        if fence is not None:
            request.fence.file, request.fence.fencing_token = lock_path(fence[0]), int(fence[1])
        return _append_retrying(lambda: self.sessions.AppendEvent(request, timeout=self.timeout))

    def append_many(
        self,
        session_id: str,
        events: Iterable[events_pb2.Event],
        *,
        expected_seq: Optional[int] = None,
        expected_state: Optional[str] = None,
        idempotency_key: str = "",
    ) -> session_service_pb2.AppendEventsResponse:
        """Appends several events atomically (all with consecutive seqs, or none); the rest as :meth:`append`."""
        request = session_service_pb2.AppendEventsRequest(session_id=session_id, events=list(events), idempotency_key=idempotency_key)
        _expect(request, expected_seq, expected_state)
        return _append_retrying(lambda: self.sessions.AppendEvents(request, timeout=self.timeout))

    def snapshot(self, session_id: str) -> Optional[snapshot_pb2.Snapshot]:
        """The session's snapshot (completed and discarded ones too: see its ``phase``), or None when
        it has no journal (the service's NOT_FOUND ``SESSION_NOT_FOUND``)."""
        try:
            return _rpc(lambda: self.sessions.GetSnapshot(session_service_pb2.GetSnapshotRequest(session_id=session_id), timeout=self.timeout)).snapshot
        except BerthError as error:
            if error.reason == "SESSION_NOT_FOUND":
                return None
            raise

    def list_sessions(self, *, include_completed: bool = False, page_size: int = 0) -> Iterator[snapshot_pb2.Snapshot]:
        """Every session's snapshot, sorted by id (active ones unless ``include_completed``), fetched
        a page of ``page_size`` at a time (0: the service's default). Sessions created while paging
        come on a later page when their id sorts after the pages already read; none comes twice."""
        token = ""
        while True:
            request = session_service_pb2.ListSessionsRequest(include_completed=include_completed, page_size=page_size, page_token=token)
            page = _rpc(lambda: self.sessions.ListSessions(request, timeout=self.timeout))
            yield from page.sessions
            token = page.next_page_token
            if not token:
                return

    def delete(self, session_id: str, *, expected_seq: Optional[int] = None, idempotency_key: str = "") -> int:
        """Deletes the session (journal and snapshot files; its watchers end with NOT_FOUND
        ``SESSION_DELETED``); returns the last seq it had. A session created again under the id
        continues from that seq + 1. ``expected_seq``: only when that is still its last seq (ABORTED
        ``SEQ_CONFLICT`` otherwise). NOT_FOUND ``SESSION_NOT_FOUND`` without a journal. With
        ``idempotency_key`` (e.g. ``str(uuid.uuid4())``) a retry with the same key answers the first
        deletion, even once the session was created again."""
        request = session_service_pb2.DeleteSessionRequest(session_id=session_id, idempotency_key=idempotency_key)
        if expected_seq is not None:
            request.expected_seq = expected_seq
        return _rpc(lambda: self.sessions.DeleteSession(request, timeout=self.timeout)).last_seq

    def session_limits(self) -> session_service_pb2.GetLimitsResponse:
        """The limits the sessions service enforces (event size, events per append, page size, retention...)."""
        return _rpc(lambda: self.sessions.GetLimits(session_service_pb2.GetLimitsRequest(), timeout=self.timeout))

    def read_journal(self, session_id: str, from_seq: int = 1, limit: int = 0) -> JournalRead:
        """The journal's entries from ``from_seq`` (all of them up to now, or ``limit``), and where the
        read ended. ``from_seq`` may be one past the last seq (nothing to read); beyond it is
        OUT_OF_RANGE ``SEQ_OUT_OF_RANGE``."""
        request = session_service_pb2.ReadJournalRequest(session_id=session_id, from_seq=from_seq, limit=limit)

        def read() -> JournalRead:
            entries: list = []
            end = session_service_pb2.ReadEnd()
            for response in self.sessions.ReadJournal(request, timeout=self.timeout):
                entries.extend(response.entries)
                if response.HasField("end"):
                    end = response.end
            return JournalRead(entries, end.last_seq, end.next_seq, end.more)

        return _rpc(read)

    def watch(
        self,
        session_id: str,
        from_seq: int = 1,
        *,
        include_snapshot: bool = False,
        resume_on_lag: bool = True,
        max_batch: int = 0,
        progress_interval: Optional[Seconds] = None,
        timeout: Optional[Seconds] = None,
    ) -> SessionWatch:
        """Follows a session: backlog entries from ``from_seq``, one ``caught_up``, then live entries;
        with ``progress_interval`` (0.1 s or more), a ``progress`` item whenever that long passed quietly."""
        return SessionWatch(self.sessions, session_id, from_seq, include_snapshot, resume_on_lag, timeout, max_batch, progress_interval)

    def watch_sessions(
        self,
        *,
        include_current: bool = False,
        include_snapshot: bool = False,
        include_completed: bool = False,
        start_revision: int = 0,
        resume_from: Optional[Mapping[str, int]] = None,
        resume_on_lag: bool = True,
        progress_interval: Optional[Seconds] = None,
        timeout: Optional[Seconds] = None,
    ) -> SessionsWatch:
        """Follows every session: with ``include_current``, one ``change`` per existing session and
        ``caught_up`` first; with ``start_revision`` (a watch's ``revision``, the last revision
        received), every change after it, then ``caught_up`` (with ``reset`` when the service can
        no longer replay them: then the current state came first, only what moved since
        ``resume_from``, a watch's ``last_seqs``, when given); then a ``change`` per append call (or
        deletion) of any session. A watcher that fell behind resumes by itself (see
        :class:`SessionsWatch`)."""
        return SessionsWatch(
            self.sessions,
            include_current=include_current,
            include_snapshot=include_snapshot,
            include_completed=include_completed,
            resume_on_lag=resume_on_lag,
            progress_interval=progress_interval,
            timeout=timeout,
            start_revision=start_revision,
            resume_from=resume_from,
        )

    # locks

    def lock(self, file: str, owner: str, *, max_wait: Optional[Seconds] = None, on_waiting: Optional[Callable[[lock_service_pb2.Waiting], None]] = None) -> HeldLock:
        """Holds the source lock on ``file`` for a ``with`` block (``with berth.lock("src/app.css", owner="me") as lease:``).

        Waits up to ``max_wait`` seconds in the queue (unset: the service's longest wait, 10 minutes
        unless configured; 0: try once), calling ``on_waiting`` with the position and the holder; a
        wait that runs out raises BerthError RESOURCE_EXHAUSTED (reason ``WAIT_EXHAUSTED``, a
        ``LockHeld`` detail naming the holder, ``retry_after``). A relative path is resolved against
        this process's working directory (see :func:`lock_path`); the lease's ``file`` is the
        canonical path.
        """
        request = lock_service_pb2.HoldRequest(file=lock_path(file), owner=owner)
        if max_wait is not None:
            request.max_wait.CopyFrom(_duration(max_wait))
        return HeldLock(self.locks, request, on_waiting)

    def acquire(
        self,
        file: str,
        owner: str,
        *,
        max_wait: Optional[Seconds] = None,
        ttl: Optional[Seconds] = None,
        request_id: str = "",
        auto_keep_alive: bool = False,
    ) -> LockLease:
        """Takes the lock on ``file`` as a lease (renew with KeepAlive, free with Release); ``file`` and
        ``max_wait`` as in :meth:`lock`.

        ``request_id`` (e.g. ``str(uuid.uuid4())``) makes a retry safe: calling again with the same
        id, file, owner and ttl answers the first call's lease (while it lives, and for the
        service's idempotency window after it ended; while the first call still waits, it waits
        with it) instead of queueing a second request. The same id for another request is refused
        ALREADY_EXISTS ``IDEMPOTENCY_KEY_REUSED``.
        """
        request = lock_service_pb2.AcquireRequest(file=lock_path(file), owner=owner, request_id=request_id)
        if max_wait is not None:
            request.max_wait.CopyFrom(_duration(max_wait))
        if ttl is not None:
            request.ttl.CopyFrom(_duration(ttl))
        # Unset, the service bounds the wait by its own longest one: no deadline of ours to cut it short.
        timeout = None if max_wait is None else self.timeout + max_wait
        lease = LockLease(self.locks, _rpc(lambda: self.locks.Acquire(request, timeout=timeout)).lease, self.timeout)
        if auto_keep_alive:
            lease.start_keep_alive()
        return lease

    def keep_alive(self, *lease_tokens: str) -> list:
        """Renews several leases in one call (unary KeepAlive): one ``Renewal`` per token, in order."""
        request = lock_service_pb2.KeepAliveRequest(lease_tokens=list(lease_tokens))
        return list(_rpc(lambda: self.locks.KeepAlive(request, timeout=self.timeout)).renewals)

    def lock_limits(self) -> lock_service_pb2.GetLimitsResponse:
        """The limits the locks enforce: default and longest ttl, longest wait, Hold heartbeat, waiters per file, owner length."""
        return _rpc(lambda: self.locks.GetLimits(lock_service_pb2.GetLimitsRequest(), timeout=self.timeout))

    def inspect(self, file: str) -> lock_service_pb2.InspectResponse:
        """The lock's holder, fencing token and waiters; ``file`` as in :meth:`lock`."""
        return _rpc(lambda: self.locks.Inspect(lock_service_pb2.InspectRequest(file=lock_path(file)), timeout=self.timeout))

    def watch_locks(
        self,
        file: Optional[str] = None,
        *,
        include_current: bool = False,
        start_revision: int = 0,
        resume_on_lag: bool = True,
        progress_interval: Optional[Seconds] = None,
        timeout: Optional[Seconds] = None,
    ) -> LocksWatch:
        """Follows the lock of ``file`` (as in :meth:`lock`), or of every file when None: with
        ``include_current``, one event per holder and waiter now; with ``start_revision`` (the last
        revision received), every change after it; then ``caught_up`` (always sent: it names the
        revision the watch starts at); then each change as it happens; with ``progress_interval``
        (0.1 s or more), a ``progress`` whenever that long passed quietly. A watcher that fell
        behind resumes by itself (see :class:`LocksWatch`)."""
        request = lock_service_pb2.WatchLocksRequest(file="" if file is None else lock_path(file), include_current=include_current, start_revision=start_revision)
        return LocksWatch(self.locks.WatchLocks, _watch_request(request, progress_interval), resume_on_lag, timeout)

    # budget

    def check(self, need: Union[budget_pb2.Need, Iterable[budget_pb2.NeedItem]], *, skip_load_gate: bool = False) -> budget_pb2.Verdict:
        """Whether a need fits now, without admitting it."""
        return _rpc(lambda: self.budget.Check(budget_service_pb2.CheckRequest(need=_need(need), skip_load_gate=skip_load_gate), timeout=self.timeout)).verdict

    def admit(
        self,
        need: Union[budget_pb2.Need, Iterable[budget_pb2.NeedItem]],
        owner: str,
        *,
        max_wait: Optional[Seconds] = None,
        skip_load_gate: bool = False,
        on_queued: Optional[Callable[[budget_service_pb2.Queued], None]] = None,
        timeout: Optional[Seconds] = None,
    ) -> Admission:
        """Admission on an Admit stream, for a ``with`` block (see :class:`Admission`). ``owner`` says
        who asks and for what; ``max_wait`` of 0 does not queue (admitted at once or refused)."""
        request = budget_service_pb2.AdmitStart(need=_need(need), owner=owner, skip_load_gate=skip_load_gate)
        if max_wait is not None:
            request.max_wait.CopyFrom(_duration(max_wait))
        return Admission(self.budget, request, on_queued, timeout)

    def reserve(
        self,
        need: Union[budget_pb2.Need, Iterable[budget_pb2.NeedItem]],
        owner: str,
        *,
        ttl: Optional[Seconds] = None,
        max_wait: Optional[Seconds] = None,
        skip_load_gate: bool = False,
        request_id: str = "",
        auto_keep_alive: bool = False,
    ) -> Reservation:
        """Admission with a lease (waits in the queue up to ``max_wait`` first; 0: not at all); see
        :class:`Reservation`. With ``request_id`` (a UUID, say) a retry of this call with the same
        need, owner, ttl and ``skip_load_gate`` answers the first call's reservation (while the first
        waits, it waits with it) instead of queueing again, also for the service's idempotency window
        after the reservation ended; the same id for another request is ALREADY_EXISTS
        ``IDEMPOTENCY_KEY_REUSED``."""
        request = budget_service_pb2.ReserveRequest(need=_need(need), owner=owner, skip_load_gate=skip_load_gate, request_id=request_id)
        if ttl is not None:
            request.ttl.CopyFrom(_duration(ttl))
        if max_wait is not None:
            request.max_wait.CopyFrom(_duration(max_wait))
        timeout = self.timeout + (max_wait if max_wait is not None else 600)
        reservation = Reservation(self.budget, _rpc(lambda: self.budget.Reserve(request, timeout=timeout)), ttl, self.timeout)
        if auto_keep_alive:
            reservation.start_keep_alive()
        return reservation

    def register_running(
        self,
        name: str,
        *,
        memory: Optional[str] = None,
        cpu: Optional[float] = None,
        pid: Optional[int] = None,
        ttl: Optional[Seconds] = None,
        reservation_id: Optional[str] = None,
        request_id: str = "",
    ) -> budget_service_pb2.RegisterRunningResponse:
        """Counts a running service until :meth:`stop_running`, until ``pid`` exits, or until its
        ``ttl`` lease runs out; with ``reservation_id`` its cost leaves that reservation's start share.
        With ``request_id``, a retry of the same request answers the first answer (counted once),
        while the entry lives and for the service's idempotency window after."""
        request = budget_service_pb2.RegisterRunningRequest(name=name, request_id=request_id)
        if memory is not None:
            request.spec.memory = str(memory)
        if cpu is not None:
            request.spec.cpu = float(cpu)
        if pid is not None:
            request.pid = pid
        if ttl is not None:
            request.ttl.CopyFrom(_duration(ttl))
        if reservation_id is not None:
            request.reservation_id = reservation_id
        return _rpc(lambda: self.budget.RegisterRunning(request, timeout=self.timeout))

    def stop_running(self, running_id: str) -> bool:
        """Stops counting a running entry; False when it was already gone."""
        return _rpc(lambda: self.budget.StopRunning(budget_service_pb2.StopRunningRequest(id=running_id), timeout=self.timeout)).stopped

    def state(self, *, page_size: int = 0, all_pages: bool = False) -> budget_service_pb2.GetStateResponse:
        """Everything the budget holds: committed, the queue, reservations and running (the first
        ``page_size`` of each, 100 by default, with ``queue_size``, ``reservation_count`` and
        ``running_count``), the policy, the machine. ``all_pages`` fetches the rest of each list."""
        state = _rpc(lambda: self.budget.GetState(budget_service_pb2.GetStateRequest(page_size=page_size), timeout=self.timeout))
        if all_pages:
            state.queue.extend(self._pages(self.budget.ListQueue, budget_service_pb2.ListQueueRequest, "queue", page_size, state.queue_next_page_token))
            state.reservations.extend(self._pages(self.budget.ListReservations, budget_service_pb2.ListReservationsRequest, "reservations", page_size, state.reservations_next_page_token))
            state.running.extend(self._pages(self.budget.ListRunning, budget_service_pb2.ListRunningRequest, "running", page_size, state.running_next_page_token))
            state.queue_next_page_token = state.reservations_next_page_token = state.running_next_page_token = ""
        return state

    def list_queue(self, *, page_size: int = 0) -> Iterator[budget_pb2.QueueEntry]:
        """The queue, head first, fetched a page at a time as the iteration goes."""
        return self._pages(self.budget.ListQueue, budget_service_pb2.ListQueueRequest, "queue", page_size)

    def list_reservations(self, *, page_size: int = 0) -> Iterator[budget_pb2.Reservation]:
        """The reservations in flight, oldest first, a page at a time."""
        return self._pages(self.budget.ListReservations, budget_service_pb2.ListReservationsRequest, "reservations", page_size)

    def list_running(self, *, page_size: int = 0) -> Iterator[budget_pb2.RunningEntry]:
        """The running tally, oldest first, a page at a time."""
        return self._pages(self.budget.ListRunning, budget_service_pb2.ListRunningRequest, "running", page_size)

    def watch_budget(
        self,
        *,
        include_current: bool = False,
        start_revision: int = 0,
        resume_on_lag: bool = True,
        progress_interval: Optional[Seconds] = None,
        timeout: Optional[Seconds] = None,
    ) -> BudgetWatch:
        """Follows every change of the budget (the queue, reservations, the running tally, the
        policy): with ``include_current``, the current state then ``caught_up``; with
        ``start_revision`` (the last revision received), the changes after it then ``caught_up``;
        neither, only the changes from now on (no ``caught_up``); with ``progress_interval`` (0.1 s
        or more), a ``progress`` whenever that long passed quietly. A watcher that fell behind
        resumes by itself (see :class:`BudgetWatch`)."""
        request = budget_service_pb2.WatchBudgetRequest(include_current=include_current, start_revision=start_revision)
        return BudgetWatch(self.budget.WatchBudget, _watch_request(request, progress_interval), resume_on_lag, timeout)

    def watch_machine(self, *, start_revision: int = 0, progress_interval: Optional[Seconds] = None, timeout: Optional[Seconds] = None) -> MachineWatch:
        """Follows the machine samples: the current one, then each new one; with ``start_revision``
        (the last sample's revision), the samples after it the service still holds; with
        ``progress_interval`` (0.1 s or more), a ``progress`` whenever no sample came for that long.
        See :class:`MachineWatch`."""
        # Never ended for lagging: a slow reader gets the latest sample.
        request = budget_service_pb2.WatchMachineRequest(start_revision=start_revision)
        return MachineWatch(self.budget.WatchMachine, _watch_request(request, progress_interval), False, timeout)

    def _pages(self, method: Callable[..., Any], request_class: type, field: str, page_size: int, token: Optional[str] = None) -> Iterator[Any]:
        """Every entry of a paged list, from ``token`` (None: the first page; "": nothing left)."""
        first = token is None
        token = token or ""
        while first or token:
            first = False
            page = _rpc(lambda: method(request_class(page_size=page_size, page_token=token), timeout=self.timeout))
            yield from getattr(page, field)
            token = page.next_page_token

    def budget_limits(self) -> budget_service_pb2.GetLimitsResponse:
        """The limits the budget enforces: lease ttls, the longest wait, the queue's size, the longest owner."""
        return _rpc(lambda: self.budget.GetLimits(budget_service_pb2.GetLimitsRequest(), timeout=self.timeout))


def to_dict(message: Message) -> dict:
    """A message as the JSON berth's journal and Connect's JSON use (lowerCamelCase keys)."""
    return json_format.MessageToDict(message)
