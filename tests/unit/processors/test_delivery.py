"""The processor's delivery loop (processors/app.py deliver_all), with a scripted producer: every write is resent
until acknowledged, only what failed goes again, and the stall watch says what waits or fails (issue 40: it was a
closure inside create_app that no test could reach)."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.stats import Stall
from processors import app
from processors.app import deliver_all
from processors.writes import Write


class _Producer:
    """Acknowledges each write, failing the first ``fail[value]`` sends of a value (refused at once when the
    failure is ``"refused"``, else a future that fails)."""

    def __init__(self, fail: dict[bytes, list[str]]) -> None:
        self.fail, self.sent, self.acked = fail, [], []  # type: ignore[var-annotated]

    async def send(self, w: Write) -> asyncio.Future[Any]:
        self.sent.append(w.value)
        how = self.fail.get(w.value, [])
        if how and how[0] == "refused":
            how.pop(0)
            raise ValueError("record too large")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if how:
            how.pop(0)
            future.set_exception(TimeoutError("broker down"))
        else:
            self.acked.append(w.value)
            future.set_result("ok")
        return future


def test_every_write_is_resent_until_acknowledged_and_only_what_failed(monkeypatch: Any) -> None:
    monkeypatch.setattr(app, "_RETRY_MAX_S", 0.01)
    producer = _Producer({b"b": ["down", "refused"], b"c": ["refused"]})
    stall = Stall("test", after=2)
    writes = [Write("t", None, v, source=f"raw/0/{i}") for i, v in enumerate((b"a", b"b", b"c"))]
    asyncio.run(deliver_all(writes, producer.send, stall))
    assert sorted(producer.acked) == [b"a", b"b", b"c"]  # every one, once
    assert producer.sent == [b"a", b"b", b"c", b"b", b"c", b"b"]  # a once; b three times, c twice
    assert stall.values()["stalled"] is False and stall.values()["stalls"] == 1  # said so on the way, then cleared


def test_nothing_to_send_returns_at_once() -> None:
    producer = _Producer({})
    asyncio.run(deliver_all([], producer.send, Stall("test")))
    assert producer.sent == []
