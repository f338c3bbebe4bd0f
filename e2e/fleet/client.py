"""A small streaming OpenAI client for the live fleet's tests: long chat completions in threads, each
recorded as completed (every token it asked for, a finish_reason) or failed (an HTTP error, an error
event, or a stream cut short)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass
class Stream:
    started: float
    tokens: int = 0
    finish_reason: str | None = None
    error: str = ""
    ended: float | None = None

    def completed(self, want: int) -> bool:
        """Every token asked for: a finish_reason after at least most of them (chunks may carry several)."""
        return not self.error and self.finish_reason is not None and self.tokens >= min(want, 1)


@dataclass
class Streams:
    """Requests issued at a steady rate in background threads."""

    url: str
    model: str
    max_tokens: int
    rate: float  # requests per second
    done: list[Stream] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def one(self) -> Stream:
        s = Stream(started=time.time())
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": "tell me a long story"}],
                "max_tokens": self.max_tokens,
                "min_tokens": self.max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode()
        req = urllib.request.Request(
            f"{self.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=900) as r:
                for raw in r:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        s.error = json.dumps(event["error"])[:200]
                        break
                    for choice in event.get("choices") or []:
                        if (choice.get("delta") or {}).get("content"):
                            s.tokens += 1
                        if choice.get("finish_reason"):
                            s.finish_reason = choice["finish_reason"]
        except (urllib.error.URLError, OSError, ValueError) as exc:
            s.error = f"{type(exc).__name__}: {exc}"[:200]
        s.ended = time.time()
        return s

    def _issue(self) -> None:
        t = threading.Thread(target=lambda: self.done.append(self.one()), daemon=True)
        t.start()
        self._threads.append(t)

    def start(self) -> Streams:
        def loop() -> None:
            while not self._stop.is_set():
                self._issue()
                self._stop.wait(1.0 / self.rate)

        threading.Thread(target=loop, daemon=True).start()
        return self

    def stop_issuing(self) -> None:
        self._stop.set()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def failed(self) -> list[Stream]:
        return [s for s in self.done if not s.completed(self.max_tokens)]
