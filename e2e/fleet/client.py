"""A small streaming OpenAI client for the live fleet's tests: long chat completions in threads, each
counted as completed (every token it asked for, by the server's own usage count, and a finish_reason) or
failed (an HTTP error, an error event, a stream cut short, or one still open when the client stopped
waiting): every stream issued is one or the other."""

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

    completion_tokens: int | None = None  # the server's count (stream_options.include_usage)

    def completed(self, want: int) -> bool:
        """Every token asked for, and a finish_reason (a chunk may carry several tokens: the server's usage
        count is the measure, the chunks only when it sent none)."""
        got = self.completion_tokens if self.completion_tokens is not None else self.tokens
        return not self.error and self.ended is not None and self.finish_reason is not None and got >= want


@dataclass
class Streams:
    """Requests issued at a steady rate in background threads."""

    url: str
    model: str
    max_tokens: int
    rate: float  # requests per second
    issued: list[Stream] = field(default_factory=list)  # every stream started, finished or not
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def one(self) -> Stream:
        s = Stream(started=time.time())
        self.issued.append(s)
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": "tell me a long story"}],
                "max_tokens": self.max_tokens,
                "min_tokens": self.max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
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
                    usage = event.get("usage") or {}
                    if usage.get("completion_tokens") is not None:
                        s.completion_tokens = int(usage["completion_tokens"])
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
        t = threading.Thread(target=self.one, daemon=True)
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
        """Every issued stream that did not complete, including those still open."""
        return [s for s in self.issued if not s.completed(self.max_tokens)]
