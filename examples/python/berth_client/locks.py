"""Source locks: held for a ``with`` block (Hold), taken as a lease (Acquire, KeepAlive, Release),
watched (WatchLocks); and ``Berth``'s calls of the lock service."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional, Union

import grpc

from .errors import BerthError, _rpc, error_from_rpc
from .proto import Seconds, _duration, lock_service_pb2, lock_service_pb2_grpc
from .keepalive import _Renewer
from .revision_watch import _RevisionWatch, _watch_request


def lock_path(file: Union[str, "os.PathLike[str]"]) -> str:
    """A lock path made absolute against this process's working directory, as every lock call sends it.

    The service refuses a relative path (INVALID_ARGUMENT naming ``file``): only the client knows
    the directory it is relative to. Joined, not normalised: the service resolves ``..`` as the
    kernel does (after a symlinked directory it is the target's parent) and answers with the
    canonical path, which is the same for every spelling of one file.
    """
    file = os.fspath(file)
    return file if os.path.isabs(file) else os.path.join(os.getcwd(), file)


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
        self._renewer = _Renewer()

    @property
    def fencing_token(self) -> int:
        return self.lease.fencing_token

    def keep_alive(self) -> lock_service_pb2.Renewal:
        """Renews the lease once for its ttl (unary KeepAlive); ``alive`` is False when it is gone."""
        request = lock_service_pb2.KeepAliveRequest(lease_tokens=[self.lease.lease_token])
        return _rpc(lambda: self._stub.KeepAlive(request, timeout=self._timeout)).renewals[0]

    def start_keep_alive(self, every: Optional[Seconds] = None) -> None:
        """Renews from a background thread (every third of the ttl by default) until released or gone."""
        if self._renewer.started:
            return
        ttl = self.lease.ttl.ToMilliseconds() / 1000 if self.lease.HasField("ttl") else 30
        interval = every if every is not None else max(ttl / 3, 0.1)
        self._renewer.start(self.keep_alive, interval, "berth-lock-keepalive")

    def release(self) -> bool:
        """Frees the lease; False when it was already gone."""
        self._renewer.stop()
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


class _LockCalls:
    """:class:`Berth`'s calls of the lock service (``Berth`` sets ``locks`` and ``timeout``)."""

    locks: lock_service_pb2_grpc.LockServiceStub
    timeout: Seconds

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
