"""The sessions service: appends (made again when overtaken), reads, a session's watch and the
watch of every session, each resuming after a lag; and ``Berth``'s calls of the service."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from .errors import BerthError, _rpc, error_from_rpc
from .locks import lock_path
from .proto import Seconds, events_pb2, session_service_pb2, session_service_pb2_grpc, snapshot_pb2
from .revision_watch import _RevisionWatch, _watch_request

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


class _SessionCalls:
    """:class:`Berth`'s calls of the sessions service (``Berth`` sets ``sessions`` and ``timeout``)."""

    sessions: session_service_pb2_grpc.SessionServiceStub
    timeout: Seconds

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
