"""Building the processor's faust app connects to nothing; its connections open once, at worker start-up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import processors.app as app_module
from pipeline.config import KafkaSettings, ServiceSettings, Settings
from pipeline.sizing import Limits
from processors.app import Connections, OpenAtStart, create_app
from processors.writes import TakeWriter


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),  # nothing listens there
        services=ServiceSettings(state_dir=tmp_path, cache_dir=tmp_path),
    )


def test_building_the_app_connects_to_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("connected while building the app")

    monkeypatch.setattr(app_module, "AdminClient", refuse)
    monkeypatch.setattr(app_module, "TopicMirror", refuse)
    app = create_app(_settings(tmp_path))
    assert "interpret" in {a.name.rsplit(".", 1)[-1] for a in app.agents.values()}


def test_connections_open_once_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    interpreter: Any = object()
    monkeypatch.setattr(app_module, "partition_count", lambda _s, topic: calls.append(topic) or 3)
    monkeypatch.setattr(app_module, "read_limits", lambda _conf, topics: calls.append("limits") or Limits())
    monkeypatch.setattr(app_module, "build_interpreter", lambda _s: (calls.append("mirrors") or interpreter, None))
    settings = _settings(tmp_path)
    connections = Connections(settings)
    assert connections.interpreter is None and calls == []

    async def start_twice() -> TakeWriter:
        await OpenAtStart(connections).on_start()
        return await connections.ready()

    writer = asyncio.run(start_twice())
    assert writer.out_partitions == 3 and writer.interpreter is interpreter
    assert calls == [settings.topics.interpreted, "limits", "mirrors"] and connections.interpreter is interpreter
