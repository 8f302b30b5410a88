"""``amd-smi`` on the node as a source: a real MI210's ``amd-smi static --json`` and AMD's documented ``amd-smi
metric`` output (tests/testdata/amd/amd-smi/README.md) read into the schema through the exporter's mapping, every
value in the schema's unit, the driver's limits in place of the catalogue's, a unit it does not expect counted and
never guessed, and the real command run as a subprocess."""

from __future__ import annotations

import copy
import json
import logging
import stat
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import BadSourceData, ConfigError, SourceUnavailable
from pipeline.events import SampleBatch
from pipeline.vocab import decode_clock_reasons
from producers.amd.exporter import ExporterState, ScrapeStats, to_batches
from producers.amd.smi import AmdSmiSource, documents, prom_samples, static_gpus, with_limits
from tests import TESTDATA

SMI = TESTDATA / "amd" / "amd-smi"
T0 = 1_800_000_000_000_000_000


def load(name: str) -> list[dict[str, Any]]:
    return documents((SMI / name).read_text())


def read(
    metric: list[dict[str, Any]], static: list[dict[str, Any]] | None = None, state: ExporterState | None = None
) -> tuple[list[SampleBatch], ScrapeStats]:
    """The batches and the counts of every value read."""
    known = static_gpus(static or [], "n1")
    stats = ScrapeStats()
    samples = prom_samples(metric, known, "n1", stats)
    batches = to_batches(samples, "dc1", "n1", T0, state or ExporterState(), stats)
    # every value read is counted once, as mapped or as what it is not
    kinds = (stats.mapped, stats.unmapped, stats.unknown, stats.blank, stats.anonymous, stats.unconvertible)
    assert stats.samples == sum(kinds), stats
    return with_limits(batches, known), stats


def metrics(batches: list[SampleBatch]) -> list[dict[str, float]]:
    return [s.metrics for b in batches for s in b.samples]


def test_a_real_mi210_static_gives_its_model_and_the_limits_its_driver_enforces() -> None:
    (gpu,) = static_gpus(load("mi210-static.json"), "n1").values()
    assert gpu.labels["card_series"] == "AMD Instinct MI210"
    # its board serial reads "0": no identity, so the node and index name it
    assert gpu.labels["gpu_uuid"] == "amd-smi:n1:0"
    # the 300 W cap; the hotspot's slowdown and shutdown (the GPU temperature is the hotspot's); PCIe x16
    assert gpu.limits == {
        "power_limit_watts": 300.0,
        "temperature_slowdown_celsius": 100.0,
        "temperature_shutdown_celsius": 105.0,
        "pcie_link_width_max": 16.0,
    }
    assert gpu.pcie_max_gt_s == 16.0 and gpu.whole


def test_the_documented_power_output_verbatim() -> None:
    batches, stats = read(load("changelog-metric-power.json"), load("mi210-static.json"))
    (m,) = metrics(batches)
    assert m["power_watts"] == 10.0
    # the static's limits ride along: the cap, the thresholds, the PCIe maximum (16 GT/s: generation 4)
    assert m["power_limit_watts"] == 300.0 and m["temperature_slowdown_celsius"] == 100.0
    assert m["pcie_link_gen_max"] == 4.0 and m["pcie_link_width_max"] == 16.0
    # three voltages, power management and the throttle flag have no field: counted, not unknown
    assert (stats.unmapped, stats.unknown, stats.unconvertible) == (5, 0, 0)
    (sample,) = [s for b in batches for s in b.samples]
    assert sample.gpu_model == "AMD Instinct MI210" and sample.gpu_uuid == "amd-smi:n1:0"


def test_the_documented_pcie_output_gives_the_generation_and_replays() -> None:
    batches, stats = read(load("changelog-metric-pcie.json"))
    assert [(m["pcie_link_gen"], m["pcie_replay_total"]) for m in metrics(batches)] == [(5.0, 0.0), (5.0, 0.0)]
    assert stats.unmapped == 2 * 10 and stats.unknown == 0


def test_the_documented_clocks_of_eight_xcds_are_averaged_and_their_maximum_kept() -> None:
    doc = load("changelog-metric-clock.json")
    clocks = [v["clk"]["value"] for k, v in doc[0]["clock"].items() if k.startswith("gfx_")]
    assert len(clocks) == 8
    (m,) = metrics(read(doc)[0])
    assert m["sm_clock_mhz"] == pytest.approx(sum(clocks) / 8)
    assert m["sm_clock_max_mhz"] == m["graphics_clock_max_mhz"] == 1800.0
    assert (m["memory_clock_mhz"], m["memory_clock_max_mhz"]) == (900.0, 1200.0)


def test_the_documented_throttle_output_reads_residency_by_cause() -> None:
    doc = load("changelog-metric-throttle.json")
    # as documented: every violation 0 % over the interval
    assert [m["throttle_reasons_mask"] for m in metrics(read(doc)[0])] == [0.0, 0.0]
    held = copy.deepcopy(doc)
    held[0]["throttle"]["ppt_violation_activity"]["value"] = 12
    held[1]["throttle"]["hbm_thermal_violation_activity"]["value"] = 3
    masks = [decode_clock_reasons(int(m["throttle_reasons_mask"])) for m in metrics(read(held)[0])]
    assert masks == [["SwPowerCap"], ["SwThermalSlowdown"]]


def test_accumulated_residency_alone_is_read_between_two_rounds() -> None:
    doc = load("changelog-metric-throttle.json")
    for gpu in doc:  # the counters only, as where amd-smi prints no percentage
        gpu["throttle"] = {k: v for k, v in gpu["throttle"].items() if k.endswith(("_accumulated", "_counter"))}
    state = ExporterState()
    first = metrics(read(doc, state=state)[0])
    assert all("throttle_reasons_mask" not in m for m in first)  # one reading: the interval is unknown
    later = copy.deepcopy(doc)
    for gpu in later:
        gpu["throttle"]["accumulation_counter"] += 1000
    later[1]["throttle"]["socket_thermal_accumulated"] += 40
    masks = [decode_clock_reasons(int(m["throttle_reasons_mask"])) for m in metrics(read(later, state=state)[0])]
    assert masks == [[], ["SwThermalSlowdown"]]


def test_units_are_converted_by_what_they_say_and_never_guessed(caplog: pytest.LogCaptureFixture) -> None:
    gpu = {
        "gpu": 0,
        "energy": {"total_energy_consumption": {"value": 20909.145914, "unit": "J"}},  # ROCm 6.2+: joules
        "mem_usage": {"total_vram": {"value": 65520, "unit": "MB"}, "used_vram": {"value": 10, "unit": "MB"}},
        "temperature": {"hotspot": {"value": 212, "unit": "F"}, "edge": 41, "mem": "N/A"},
        "usage": {"gfx_activity": 55, "umc_activity": {"value": 3, "unit": "%"}},
    }
    with caplog.at_level(logging.INFO, logger="producers.amd.smi"):
        batches, stats = read([gpu, {**gpu, "gpu": 1}])
    m = metrics(batches)[0]
    assert m["energy_joules"] == pytest.approx(20909.145914)
    assert (m["memory_total_bytes"], m["memory_used_bytes"]) == (65520 * 2**20, 10 * 2**20)
    # the hotspot in Fahrenheit is no reading (counted, named once); the edge sensor gives the temperature
    assert m["temperature_gpu_celsius"] == 41.0 and "temperature_memory_celsius" not in m
    assert (m["utilization_gpu_percent"], m["utilization_memory_percent"]) == (55.0, 3.0)
    assert stats.unconvertible == 2 and sum("'F'" in r.getMessage() for r in caplog.records) == 1
    # a bare energy reading's unit changed between releases (uJ, then J): not guessed
    _, bare = read([{"gpu": 0, "energy": {"total_energy_consumption": 123}, "usage": {"gfx_activity": 1}}])
    assert bare.unconvertible == 1


def test_a_key_it_does_not_know_is_counted_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    gpu = {"gpu": 0, "usage": {"gfx_activity": {"value": 5, "unit": "%"}}, "npu": {"tops": 3}}
    with caplog.at_level(logging.INFO, logger="producers.amd.smi"):
        _, stats = read([gpu, {**gpu, "gpu": 1}])
    assert stats.unknown == 2 and sum("npu.tops" in r.getMessage() for r in caplog.records) == 1


def test_both_json_layouts_and_the_warnings_before_them() -> None:
    records = load("changelog-metric-power.json")
    wrapped = "WARNING: User is missing the following required groups: render, video\n" + json.dumps(
        {"gpu_data": records}
    )
    assert documents(wrapped) == records
    with pytest.raises(Exception, match="not a list of GPUs"):
        documents('{"gpu": "zero"}')


def test_a_compute_partition_keeps_its_gpus_limits_out_of_its_own() -> None:
    static = load("mi210-static.json")
    static[0]["partition"] = {"compute_partition": "DPX", "memory_partition": "NPS1"}
    (m,) = metrics(read(load("changelog-metric-power.json"), static)[0])
    assert "power_limit_watts" not in m and m["power_watts"] == 10.0


def _fake_amd_smi(tmp_path: Path, metric: str) -> Path:
    """A stand-in ``amd-smi`` executable printing the test data for ``static`` and ``metric``."""
    script = tmp_path / "amd-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = static ] && cat {SMI / "mi210-static.json"} && exit 0\n'
        f'[ "$1" = metric ] && echo "WARNING: not in render group" && cat {SMI / metric} && exit 0\n'
        "echo unknown command >&2; exit 2\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_source_runs_the_command_as_a_subprocess(tmp_path: Path) -> None:
    source = AmdSmiSource(str(_fake_amd_smi(tmp_path, "changelog-metric-power.json")), "dc1", "n1", timeout_s=10)
    source.open()
    (batch,) = source.collect(T0)
    (sample,) = batch.samples
    assert (sample.node, sample.gpu_model, sample.metrics["power_watts"]) == ("n1", "AMD Instinct MI210", 10.0)
    assert [g.uuid for t in source.topologies(T0) for g in t.gpus] == ["amd-smi:n1:0"]
    assert source.stats()["unmapped_values"] == 5


def test_a_missing_command_stops_start_up_and_a_failing_one_fails_the_round(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'no-such-amd-smi' is not a command here"):
        AmdSmiSource("no-such-amd-smi", "dc1", "n1").open()
    broken = tmp_path / "amd-smi"
    broken.write_text("#!/bin/sh\necho 'amdsmi_init failed' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(SourceUnavailable, match="exited 1: amdsmi_init failed"):
        AmdSmiSource(str(broken), "dc1", "n1").open()
    garbled = AmdSmiSource("amd-smi", "dc1", "n1", run=lambda argv, _t: "not json at all")
    with pytest.raises(BadSourceData):
        garbled.open()
