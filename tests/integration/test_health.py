"""Health from real alerts through a real Kafka: the alert manager (a child process) publishes each GPU's state,
remedy and reasons on the compacted health topic as its alerts change, a kill -9 and restart contradicts nothing,
and ``hermeneut health`` (CLI, with InfluxDB for the fleet's membership) says the same."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.stages import start_stage
from hermeneut.web.app import create_app, serving
from pipeline.config import Settings, settings_env
from pipeline.events import Severity
from pipeline.services.stages import wait_for
from tests.integration.alerting_parts import fault, publish_findings, start_manager, tail, with_alerts
from tests.integration.harness import consume_all
from tests.webserver import get_json

pytestmark = pytest.mark.integration


def latest(settings: Settings, *want: str) -> dict[str, dict[str, Any]]:
    """The health topic as a consumer that compacts it sees it: the last record per key of this test's cluster, once
    every key in ``want`` is there (the manager also publishes what the shared InfluxDB's history says of other
    tests' clusters: escalation reads every cluster's)."""
    out: dict[str, dict[str, Any]] = {}

    def read() -> bool:
        for m in consume_all(settings, settings.topics.health, 10**6, timeout_s=3):
            key = (m.key() or b"").decode()
            if key.startswith(f"{settings.cluster}/"):
                out[key] = json.loads(m.value() or b"{}")
        return all(k in out for k in want)

    assert wait_for(read, 45), (want, sorted(out))
    return out


def test_health_follows_the_alerts_on_a_compacted_topic_and_survives_a_restart(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = with_alerts(settings)
    c = settings.cluster
    manager = start_manager(settings, tmp_path / "1")
    try:
        publish_findings(settings, [
            fault(settings, True, "ecc-uncorrectable", "GPU-1", severity=Severity.CRITICAL),
            fault(settings, True, "thermal-throttling", "GPU-2"),
            fault(settings, True, "idle-capacity", "GPU-3", node="n2", severity=Severity.INFO),
        ])  # fmt: skip
        assert wait_for(lambda: manager.stats().get("health_records", 0) >= 3, 30), tail(manager)
        h = latest(settings, f"{c}/n1/GPU-1", f"{c}/n1/GPU-2", f"{c}/n2/GPU-3")
        one, two, three = h[f"{c}/n1/GPU-1"], h[f"{c}/n1/GPU-2"], h[f"{c}/n2/GPU-3"]
        assert (one["state"], one["remedy"]) == ("unhealthy", "reset GPU")
        assert [r["detector"] for r in one["reasons"]] == ["ecc-uncorrectable"]
        assert (two["state"], two["remedy"]) == ("degraded", "hardware inspection")
        assert (three["state"], three["remedy"], three["reasons"]) == ("healthy", "none", [])  # info: a property

        for name, value in settings_env(settings).items():
            monkeypatch.setenv(name, value)
        result = CliRunner().invoke(cli, ["health", "--cluster", c, "--gpu", "GPU-2", "--format", "json"])
        assert result.exit_code == 0, result.output
        shown = json.loads(result.output)
        assert [(g["gpu"], g["state"], g["remedy"]) for g in shown["gpus"]] == [
            ("GPU-2", "degraded", "hardware inspection")
        ]
        result = CliRunner().invoke(cli, ["health", "--cluster", c])
        assert result.exit_code == 0 and "node " + c + "/n1: unhealthy, remedy: reset GPU" in result.output, (
            result.output
        )

        publish_findings(settings, [fault(settings, False, "ecc-uncorrectable", "GPU-1", severity=Severity.CRITICAL)])
        assert wait_for(lambda: latest(settings, f"{c}/n1/GPU-1")[f"{c}/n1/GPU-1"]["state"] == "healthy", 30), tail(
            manager
        )

        manager.proc.kill()
        manager.proc.wait()
        before = {k: (v["state"], v["remedy"]) for k, v in latest(settings).items()}
        manager = start_manager(settings, tmp_path / "2")
        assert wait_for(lambda: manager.stats().get("health_records", 0) >= 1, 30), tail(manager)
        after = {k: (v["state"], v["remedy"]) for k, v in latest(settings, *before).items()}
        assert after == before  # republished from the restored alerts: the same, nothing stale
    finally:
        assert manager.stop(30) == 0, tail(manager)


def test_a_kind_in_shadow_mode_is_stored_and_counted_but_never_alerted_nor_in_health(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = with_alerts(settings, shadow="thermal-throttling,power-brake")
    c = settings.cluster
    sink = start_stage("sink", settings, tmp_path)
    manager = start_manager(settings, tmp_path / "alerts")
    try:
        assert wait_for(lambda: bool(sink.stats().get("assigned")), 90), sink.stats()
        publish_findings(settings, [
            fault(settings, True, "thermal-throttling", "GPU-1"),
            fault(settings, True, "thermal-throttling", "GPU-3", node="n2"),
            fault(settings, True, "ecc-uncorrectable", "GPU-2", severity=Severity.CRITICAL),
        ])  # fmt: skip
        assert wait_for(lambda: manager.stats().get("shadow_alerts", 0) >= 2, 30), tail(manager)
        assert wait_for(lambda: manager.stats().get("health_records", 0) >= 1, 30), tail(manager)
        stats = manager.stats()
        assert (stats["shadow_findings"], stats["shadow_alerts"], stats["shadow_firing"]) == (2, 2, 2), stats
        assert stats["shadow_by_kind"] == {"thermal-throttling": 2}, stats
        assert stats["alerts_firing"] == 1, stats  # the ECC error only
        assert set(latest(settings, f"{c}/n1/GPU-2")) == {f"{c}/n1/GPU-2"}  # the shadow kind changed no GPU's health

        assert wait_for(lambda: sink.stats().get("findings_written", 0) >= 3, 30), sink.stats()
        for name, value in settings_env(settings).items():
            monkeypatch.setenv(name, value)
        result = CliRunner().invoke(cli, ["alerts", "shadow", "--cluster", c, "--format", "json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output) == [
            {"kind": "power-brake", "episodes": 0, "critical": 0, "warning": 0, "info": 0, "gpus": 0, "nodes": 0},
            {"kind": "thermal-throttling", "episodes": 2, "critical": 0, "warning": 2, "info": 0, "gpus": 2,
             "nodes": 2},
        ]  # fmt: skip
    finally:
        assert manager.stop(30) == 0, tail(manager)
        sink.stop()


def test_health_of_the_past_at_and_over_a_time_and_an_empty_selection(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imported history, judged afterwards from what InfluxDB stores (no alert manager runs): a node reports for
    10 minutes three days ago with an uncorrectable ECC error on GPU-1 (repeated, never cleared: the node went dark)
    and thermal throttling on GPU-2 (cleared at 300 s). At 200 s both fire; two hours later the ECC error is still
    open, marked stale, and GPU-2 is unknown (silent), not healthy; over 100..400 s the throttling counts and says
    when it cleared. A window in which nothing reported is an empty selection: exit 4, never 'healthy'."""
    from sinks.influxdb.lines import finding_line
    from sinks.influxdb.write import InfluxWriter

    c, s = settings.cluster, 10**9
    t0 = (time.time_ns() // s - 3 * 86_400) * s
    model = "NVIDIA\\ H100\\ 80GB\\ HBM3"
    lines = [
        f'gpu,application=llm-pretraining,cluster={c},gpu=GPU-{g},gpu_index={g},gpu_model={model},node=n1 '
        f'verdict="normal",utilization_gpu_percent=90.0 {(t0 + k * 10 * s) // 10**6}'
        for g in (1, 2) for k in range(60)
    ]  # fmt: skip
    ecc = [fault(settings, True, "ecc-uncorrectable", "GPU-1", severity=Severity.CRITICAL, ts_ns=t0 + k * 60 * s)
           for k in range(1, 10)]  # fmt: skip
    ecc = [dataclasses.replace(f, since_ns=t0 + 60 * s) for f in ecc]
    heat = [
        dataclasses.replace(
            fault(settings, active, "thermal-throttling", "GPU-2", ts_ns=t0 + t * s), since_ns=t0 + 120 * s
        )
        for t, active in ((120, True), (180, True), (240, True), (300, False))
    ]
    writer = InfluxWriter.from_settings(settings.influxdb)
    writer.write(lines + [finding_line(f) for f in ecc + heat])
    writer.close()
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)

    def health(*args: str) -> tuple[int, dict[str, Any]]:
        result = CliRunner().invoke(cli, ["health", "--cluster", c, "--format", "json", *args])
        assert result.exit_code in (0, 4), result.output
        return result.exit_code, json.loads(result.output)

    def states(data: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
        return {g["gpu"]: (g["state"], [r["summary"] for r in g["reasons"]]) for g in data["gpus"]}

    iso = lambda ns: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / s))  # noqa: E731
    code, at_200 = health("--at", iso(t0 + 200 * s))
    assert code == 0 and not at_200["empty"]
    assert {g: st for g, (st, _) in states(at_200).items()} == {"GPU-1": "unhealthy", "GPU-2": "degraded"}

    code, later = health("--at", iso(t0 + 7200 * s))
    (one_state, one_why), (two_state, _) = states(later)["GPU-1"], states(later)["GPU-2"]
    assert one_state == "unhealthy" and any("stale: no word of it since" in why for why in one_why), one_why
    assert two_state == "unknown"  # silent, nothing firing: not known healthy

    code, over = health("--range", f"{iso(t0 + 100 * s)}..{iso(t0 + 400 * s)}")
    assert states(over)["GPU-2"][0] == "degraded" and "(cleared at " in states(over)["GPU-2"][1][0]

    code, nothing = health("--at", iso(t0 - 86_400 * s), "--lookback", "1h")
    assert code == 4 and nothing["empty"] and sum(nothing["gpus_by_state"].values()) == 0
    result = CliRunner().invoke(
        cli, ["health", "--cluster", c, "--range", f"{iso(t0 - 7200 * s)}..{iso(t0 - 3600 * s)}"]
    )
    assert result.exit_code == 4 and "empty selection: no GPU of cluster" in result.output, result.output
    assert "healthy" not in result.output

    # GET /api/v1/health?at=&range= answers the same from the same function (no alert manager runs: no Kafka read)
    with serving(create_app(settings)) as url:

        def api(query: str) -> dict[str, Any]:
            status, body = get_json(f"{url}/api/v1/health?cluster={c}&{query}")
            assert status == 200, body
            return body

        assert api(f"at={iso(t0 + 200 * s)}") == at_200
        assert api(f"at={iso(t0 + 7200 * s)}") == later
        assert api(f"range={iso(t0 + 100 * s)}..{iso(t0 + 400 * s)}") == over
        empty = api(f"range={iso(t0 - 7200 * s)}..{iso(t0 - 3600 * s)}")
        assert empty["empty"] and empty["gpus"] == [] and sum(empty["gpus_by_state"].values()) == 0
        assert empty["empty_selection"].startswith(f"no GPU of cluster {c} reported between "), empty
        status, body = get_json(f"{url}/api/v1/health?cluster={c}&range={iso(t0 + 400 * s)}..{iso(t0 + 100 * s)}")
        assert status == 400 and body["error"].endswith("its start must be before its end"), body
