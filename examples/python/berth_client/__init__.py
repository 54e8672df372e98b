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
beside this package (where ``generate.sh`` puts them by default).

The modules: ``proto`` (the stubs, imported once for all), ``errors`` (BerthError and the
details decoded), ``connection`` (where the services are, the token, the channels),
``revision_watch`` (the watches numbered by revision and their resume after a lag), ``keepalive``
(a lease renewed from a background thread), ``sessions``,
``locks`` and ``budget`` (each service's wrappers and its calls of ``Berth``), ``client``
(``Berth``). Import from the package: the module a name lives in may change.
"""

# proto first: it puts the stubs on sys.path, and every other module imports them from it.
from .proto import Seconds, to_dict
from .errors import ERROR_DETAILS_TRAILER, STATUS_DETAILS_TRAILER, BerthError, error_from_rpc
from .connection import DEFAULT_BUDGET_URL, DEFAULT_SESSIONS_URL, resolve_token, resolve_url
from .sessions import JournalRead, SessionsWatch, SessionWatch, WatchEvent, event
from .locks import HeldLock, LockLease, LocksWatch, lock_path
from .budget import Admission, BudgetWatch, MachineWatch, Reservation, appliance, build, start
from .client import Berth

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
    "lock_path",
    "resolve_token",
    "resolve_url",
    "start",
    "to_dict",
    "DEFAULT_BUDGET_URL",
    "DEFAULT_SESSIONS_URL",
    "ERROR_DETAILS_TRAILER",
    "STATUS_DETAILS_TRAILER",
    "Seconds",
]
