"""Informers: list, then watch, one kind of object, and hand every event to a callback (after
controller-runtime's informer cache, without its generality).

Each informer runs in a daemon thread: a paged list (whose result replaces what the callback knew of the
kind, so objects deleted while not watching are noticed), then watches from the list's resourceVersion,
resumed from the last seen version when the server ends a watch, and listed again when the version has
expired (410 Gone) or the connection failed. Selectors are applied by the API server, so objects outside
them cost nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenfab.adapters.kube import ApiError, Kube, Obj

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """What to watch: a kind, optionally one namespace, with server-side selectors."""

    name: str  # e.g. "Pod", "ForeignPod" (used by the callbacks to tell streams apart)
    api_version: str
    kind: str
    namespace: str | None = None
    label_selector: str = ""
    field_selector: str = ""


class Informer:
    def __init__(
        self,
        kube: Kube,
        source: Source,
        on_event: Callable[[str, Obj], Any],
        on_list: Callable[[list[Obj]], Any],
        retry_seconds: float = 2.0,
    ) -> None:
        self.kube = kube
        self.source = source
        self.on_event = on_event
        self.on_list = on_list
        self.retry_seconds = retry_seconds
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{source.name}", daemon=True)
        self.lists = 0
        self.events = 0

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # closing an already closed stream
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()

    def _opened(self, resp: Any) -> None:
        self._resp = resp

    def _run(self) -> None:
        s = self.source
        while not self._stop.is_set():
            try:
                items, rv = self.kube.list_page(
                    s.api_version, s.kind, s.namespace, s.label_selector, s.field_selector
                )
                self.lists += 1
                self.on_list(items)
                self.synced.set()
                while not self._stop.is_set():
                    rv, expired = self._watch(rv)
                    if expired:
                        break
            except ApiError as exc:
                if self._stop.is_set():
                    return
                log.warning(
                    "watch of %s failed (%s); listing again in %.0f s", s.name, exc, self.retry_seconds
                )
                self._stop.wait(self.retry_seconds)
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("watch of %s failed; listing again in %.0f s", s.name, self.retry_seconds)
                self._stop.wait(self.retry_seconds)

    def _watch(self, rv: str) -> tuple[str, bool]:
        """One watch request; returns the last resourceVersion seen and whether it expired."""
        s = self.source
        for event in self.kube.watch(
            s.api_version, s.kind, rv, s.namespace, s.label_selector, s.field_selector, on_open=self._opened
        ):
            typ, obj = event.get("type"), event.get("object") or {}
            if typ == "ERROR":
                code = obj.get("code")
                if code == 410:  # too old: list again
                    return rv, True
                raise ApiError(
                    int(code or 0), str(obj.get("reason")), str(obj.get("message")), "WATCH", s.name
                )
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if new_rv:
                rv = str(new_rv)
            if typ == "BOOKMARK":
                continue
            self.events += 1
            try:
                self.on_event(str(typ), obj)
            except Exception:
                log.exception("handling a %s event of %s failed", typ, s.name)
            if self._stop.is_set():
                break
        return rv, False
