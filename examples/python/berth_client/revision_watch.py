"""What the watches numbered by revision share (every session, the locks, the budget, the machine):
the revision seen so far, and resuming from the revision a WATCHER_LAGGED error names."""

from __future__ import annotations

from typing import Any, Callable, Optional

import grpc
from google.protobuf.message import Message

from .errors import BerthError, error_from_rpc
from .proto import Seconds, _duration


def _watch_request(request: Message, progress_interval: Optional[Seconds]) -> Message:
    """A watch's request, asking for a ``progress`` message whenever ``progress_interval`` seconds
    pass quietly (None: never)."""
    if progress_interval is not None:
        request.progress_interval.CopyFrom(_duration(progress_interval))
    return request


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
