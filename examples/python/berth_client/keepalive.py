"""Renewing a lease from a background thread: what a lock's lease and a budget reservation share."""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from .errors import BerthError
from .proto import Seconds


class _Renewer:
    """Calls ``renew`` every ``interval`` seconds from a daemon thread until stopped or the lease is gone."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, renew: Callable[[], Any], interval: Seconds, name: str) -> None:
        if self._thread is not None:
            return

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    if not renew().alive:
                        return
                except BerthError:
                    pass  # transient: the next tick tries again before the lease runs out

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
