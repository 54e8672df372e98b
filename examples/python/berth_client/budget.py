"""The budget: needs (start, appliance, build), admission on an Admit stream or as a leased
reservation, the lists page by page, the watches of the budget and of the machine; and
``Berth``'s calls of the budget service."""

from __future__ import annotations

import queue
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import grpc
from google.protobuf.message import Message

from .errors import BerthError, _rpc, error_from_rpc
from .proto import Seconds, _duration, budget_pb2, budget_service_pb2, budget_service_pb2_grpc, error_details_pb2
from .keepalive import _Renewer
from .revision_watch import _RevisionWatch, _watch_request


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
        self._renewer = _Renewer()
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
        if self._renewer.started:
            return
        expires = self.reservation.expire_time.ToMilliseconds() if self.reservation.HasField("expire_time") else 0
        admitted = self.reservation.admit_time.ToMilliseconds() if self.reservation.HasField("admit_time") else 0
        interval = every if every is not None else max(((self._ttl or (expires - admitted) / 1000) or 30) / 3, 0.1)
        self._renewer.start(self.keep_alive, interval, "berth-keepalive")

    def release(self) -> bool:
        """Releases it; False when it was already gone (released or expired)."""
        self._renewer.stop()
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


class _BudgetCalls:
    """:class:`Berth`'s calls of the budget service (``Berth`` sets ``budget`` and ``timeout``)."""

    budget: budget_service_pb2_grpc.BudgetServiceStub
    timeout: Seconds

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
