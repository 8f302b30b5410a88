"""AMD's device-metrics-exporter as a source: its documented field list covered, every mapped field in the schema's
unit, generations told apart, throttling by cause, AFIDs as events, on AMD's data (tests/testdata/amd/README.md)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping

import pytest
import yaml

from pipeline import catalogue
from pipeline.codec import decode_samples, encode_samples
from pipeline.config import ValidationSettings
from pipeline.errors import BadSourceData
from pipeline.events import METRIC_NAMES, EventKind, SampleBatch
from pipeline.vocab import decode_clock_reasons
from processors.normalize import RawMessage, process_raw
from producers.amd.exporter import (
    FIELDS,
    METRICS,
    AmdExporterSource,
    ExporterState,
    ScrapeStats,
    canonical,
    is_mapped,
    model_of,
    not_mapped_reason,
    to_batches,
)
from producers.dcgm_exporter import parse_exposition
from tests import TESTDATA

AMD = TESTDATA / "amd"
MATRIX = AMD / "device-metrics-exporter-fields" / "metrics-support-matrix.yaml"
DOCS = AMD / "device-metrics-exporter-docs" / "metricslist-examples.prom"
MI300X_VF = AMD / "device-metrics-exporter-issues" / "mi300x-vf-issue171.prom"
T0 = 1_800_000_000_000_000_000
MIB = 2**20


def documented() -> dict[str, list[str]]:
    """The exporter's documented fields (as it prints them) -> the platforms AMD says emit them."""
    rows = yaml.safe_load(MATRIX.read_text())["metrics"]
    return {row["name"].lower(): row["platforms"] for row in rows}


def real_labels() -> str:
    """The label set of the real MI300X VF line (issue #171), to carry the values below."""
    line = next(x for x in MI300X_VF.read_text().splitlines() if x.startswith("gpu_edge_temperature{"))
    return line[line.index("{") + 1 : line.rindex("}")]


def scrape(
    text: str, state: ExporterState | None = None, ts_ns: int = T0
) -> tuple[list[SampleBatch], ScrapeStats, ExporterState]:
    state = state if state is not None else ExporterState()
    stats = ScrapeStats()
    return to_batches(parse_exposition(text), "dc1", "fallback", ts_ns, state, stats), stats, state


def one_gpu(text: str, state: ExporterState | None = None) -> dict[str, float]:
    batches, _, _ = scrape(text, state)
    assert len(batches) == 1 and len(batches[0].samples) == 1
    return batches[0].samples[0].metrics


def lines(values: Mapping[str, float], labels: str | None = None, **extra: str) -> str:
    """Exposition lines of ``values`` on ``labels`` (default: the real MI300X VF's), ``extra`` labels set or added."""
    pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels or real_labels())) | extra
    rendered = ",".join(f'{k}="{v}"' for k, v in pairs.items())
    return "\n".join(f"{name}{{{rendered}}} {value}" for name, value in values.items()) + "\n"


# --- the documented field list --------------------------------------------------------------------------------


def test_every_documented_field_is_mapped_or_not_mapped_with_a_reason() -> None:
    fields = documented()
    assert len(fields) == 142  # the matrix as copied (a re-copy with new fields must be looked at)
    unaccounted = [n for n in fields if not is_mapped(n) and not_mapped_reason(n) is None]
    assert unaccounted == []
    assert not [n for n in fields if is_mapped(n) and not_mapped_reason(n) is not None], "both mapped and not"


def test_the_mapping_names_only_documented_fields_and_each_generations_own() -> None:
    fields = documented()
    assert set(METRICS) <= set(fields), sorted(set(METRICS) - set(fields))
    # the generation-specific fields the issue names: MI2xx's edge sensor, MI3xx's junction and socket power
    assert (
        fields["gpu_edge_temperature"] == ["MI2xx"] and METRICS["gpu_edge_temperature"][0] == "temperature_gpu_celsius"
    )
    assert fields["gpu_junction_temperature"] == ["MI3xx"]
    assert METRICS["gpu_junction_temperature"][0] == "temperature_gpu_celsius"
    assert fields["gpu_package_power"] == ["MI3xx"] and METRICS["gpu_package_power"][0] == "power_watts"
    assert METRICS["gpu_average_package_power"][0] == "power_watts"  # MI2xx's power
    assert set(METRIC_NAMES) >= FIELDS


def test_a_field_the_exporter_does_not_document_is_counted_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    text = lines({"gpu_gfx_activity": 40, "gpu_future_thing": 1}) + lines({"gpu_future_thing": 2}, gpu_id="1")
    with caplog.at_level(logging.INFO, logger="producers.amd.exporter"):
        _, stats, _ = scrape(text)
    assert stats.unknown == 2 and stats.unknown_names == {"gpu_future_thing"}
    assert sum("gpu_future_thing" in r.getMessage() for r in caplog.records) == 1


# --- real and documented exposition ---------------------------------------------------------------------------


def test_the_real_mi300x_vf_line_is_an_absent_edge_temperature_not_0_celsius() -> None:
    batches, stats, _ = scrape(MI300X_VF.read_text())
    assert batches == []  # its only series had no value: no sample of catalogue limits alone
    assert (stats.samples, stats.blank, stats.mapped) == (1, 1, 0)
    labels = dict(parse_exposition(MI300X_VF.read_text())[0].labels)
    assert model_of(labels) == "AMD Instinct MI300X"
    # the market name amd-smi printed for a real MI210 (ROCm/amdsmi#38) names its family first
    assert model_of({"card_series": "Aldebaran/MI200 [Instinct MI210"}) == "AMD Instinct MI210"


def test_the_documented_clock_and_xgmi_examples() -> None:
    batches, stats, _ = scrape(DOCS.read_text())
    (sample,) = batches[0].samples  # GPUs 3 and 5 show only data, video and SoC clocks: no field
    assert (sample.gpu_uuid, sample.gpu_index, sample.node) == ("xxxx/0", 0, "xxxx")
    assert sample.metrics == {"sm_clock_mhz": 132.0, "memory_clock_mhz": 900.0}
    assert (stats.samples, stats.mapped, stats.unmapped, stats.unknown) == (21, 2, 19, 0)
    assert stats.samples == stats.mapped + stats.unmapped + stats.unknown + stats.blank + stats.anonymous


# --- every mapped field, value and unit -----------------------------------------------------------------------

#: exporter field, value as printed, the schema field, value in its unit. Readings as a real MI300X showed them
#: (rocm-smi in ROCm/device-metrics-exporter#139: 39.0 C junction, 182.0 W socket; an MI300X's 131 MHz SCLK and
#: 900 MHz MCLK at idle, 196592 MB of VRAM as amd-smi reports it), carried on the real MI300X VF label set
UNITS = [
    ("gpu_gfx_activity", 12, "utilization_gpu_percent", 12.0),
    ("gpu_umc_activity", 3, "utilization_memory_percent", 3.0),
    ("gpu_total_vram", 196592, "memory_total_bytes", 196592 * MIB),
    ("gpu_used_vram", 614, "memory_used_bytes", 614 * MIB),
    ("gpu_junction_temperature", 39, "temperature_gpu_celsius", 39.0),
    ("gpu_memory_temperature", 33, "temperature_memory_celsius", 33.0),
    ("gpu_package_power", 182, "power_watts", 182.0),
    ("gpu_energy_consumed", 1.5e12, "energy_joules", 1.5e6),
    ("pcie_replay_count", 2, "pcie_replay_total", 2.0),
    ("gpu_ecc_correct_total", 5, "ecc_corrected_total", 5.0),
    ("gpu_ecc_uncorrect_total", 1, "ecc_uncorrected_total", 1.0),
    ("pcie_speed", 32, "pcie_link_gen", 5.0),
    ("pcie_max_speed", 32, "pcie_link_gen_max", 5.0),
]


@pytest.mark.parametrize(("name", "printed", "field", "expected"), UNITS)
def test_every_mapped_field_is_right_in_value_and_unit(name: str, printed: float, field: str, expected: float) -> None:
    m = one_gpu(lines({name: printed}))
    assert m[field] == pytest.approx(expected)


def test_every_mapped_field_has_a_unit_case() -> None:
    assert {name for name, *_ in UNITS} | {
        "gpu_edge_temperature",
        "gpu_power_usage",
        "gpu_average_package_power",
    } == set(METRICS) | {"pcie_speed", "pcie_max_speed"}


def test_clocks_fold_over_the_xcds_and_maxima_fill_sm_and_graphics() -> None:
    text = "".join(
        lines({"gpu_clock": mhz}, clock_type="system", clock_index=str(i)) for i, mhz in enumerate((131, 133, 132))
    )
    text += lines({"gpu_clock": 900}, clock_type="memory", clock_index="8")
    text += lines({"gpu_max_clock": 2100}, clock_type="system", clock_index="0")
    text += lines({"gpu_max_clock": 1300}, clock_type="memory", clock_index="8")
    m = one_gpu(text)
    assert m["sm_clock_mhz"] == 132.0 and m["memory_clock_mhz"] == 900.0
    assert m["sm_clock_max_mhz"] == m["graphics_clock_max_mhz"] == 2100.0 and m["memory_clock_max_mhz"] == 1300.0


def test_memory_total_from_used_and_free_when_total_is_not_printed() -> None:
    labels = real_labels().replace('card_series="Aqua Vanjaram [Instinct MI300X VF]"', 'card_series="Instinct MI210"')
    m = one_gpu(lines({"gpu_used_vram": 614, "gpu_free_vram": 64898}, labels))
    assert m["memory_total_bytes"] == (614 + 64898) * MIB


def test_a_pcie_rate_that_is_no_generation_is_counted_not_guessed() -> None:
    batches, stats, _ = scrape(lines({"pcie_speed": 20, "gpu_gfx_activity": 1}))
    assert "pcie_link_gen" not in batches[0].samples[0].metrics and stats.unconvertible == 1


# --- generations, partitions, identity, blanks ----------------------------------------------------------------


@pytest.mark.parametrize(
    "order",
    [("gpu_edge_temperature", "gpu_junction_temperature"), ("gpu_junction_temperature", "gpu_edge_temperature")],
)
def test_junction_wins_over_edge_in_either_order(order: tuple[str, str]) -> None:
    values = {"gpu_junction_temperature": 61, "gpu_edge_temperature": 45}
    assert one_gpu(lines({name: values[name] for name in order}))["temperature_gpu_celsius"] == 61.0


def test_mi2xx_edge_temperature_and_average_power_stand_in() -> None:
    labels = real_labels().replace('card_series="Aqua Vanjaram [Instinct MI300X VF]"', 'card_series="Instinct MI250X"')
    m = one_gpu(lines({"gpu_edge_temperature": 44, "gpu_average_package_power": 48}, labels))
    assert m["temperature_gpu_celsius"] == 44.0 and m["power_watts"] == 48.0
    assert m["power_limit_watts"] == catalogue.lookup("AMD Instinct MI250X").power_default_watts  # type: ignore[union-attr]


def test_package_power_wins_over_power_usage_over_the_average() -> None:
    values = {"gpu_average_package_power": 170, "gpu_power_usage": 181, "gpu_package_power": 182}
    assert one_gpu(lines(values))["power_watts"] == 182.0
    assert one_gpu(lines({"gpu_average_package_power": 170, "gpu_power_usage": 181}))["power_watts"] == 181.0


def test_zero_temperature_and_power_are_no_reading_and_sentinels_are_blank() -> None:
    batches, stats, _ = scrape(
        lines({"gpu_junction_temperature": 0, "gpu_package_power": 0, "gpu_gfx_activity": 65535, "gpu_umc_activity": 7})
    )
    assert batches[0].samples[0].metrics.keys() >= {"utilization_memory_percent"}
    assert (
        not {"temperature_gpu_celsius", "power_watts", "utilization_gpu_percent"} & batches[0].samples[0].metrics.keys()
    )
    assert stats.blank == 3


def test_a_compute_partition_is_its_own_gpu_without_the_boards_limits() -> None:
    labels = real_labels().replace('gpu_compute_partition_type="spx"', 'gpu_compute_partition_type="cpx"')
    labels = labels.replace('gpu_partition_id="0"', 'gpu_partition_id="3"')
    batches, _, _ = scrape(lines({"gpu_gfx_activity": 50, "gpu_total_vram": 24574}, labels))
    (s,) = batches[0].samples
    assert s.gpu_model == "AMD Instinct MI300X CPX" and catalogue.lookup(s.gpu_model) is None
    assert s.metrics == {"utilization_gpu_percent": 50.0, "memory_total_bytes": 24574.0 * MIB}


def test_whole_gpus_get_the_catalogues_limits_but_no_link_count() -> None:
    m = one_gpu(lines({"gpu_gfx_activity": 50}))
    spec = catalogue.lookup("AMD Instinct MI300X")
    assert spec is not None and m["power_limit_watts"] == 750 and m["memory_total_bytes"] == spec.memory_bytes
    assert "nvlink_links_max" not in m


def test_identity_is_the_uuid_else_serial_and_index_else_anonymous() -> None:
    no_uuid = real_labels().replace('gpu_uuid="17ff74b5-0000-1000-805c-37b0fbe69430"', 'gpu_uuid=""')
    serial = no_uuid.replace('serial_number=""', 'serial_number="692409005408"')
    text = lines({"gpu_gfx_activity": 1}) + lines({"gpu_gfx_activity": 2}, serial).replace('gpu_id="0"', 'gpu_id="1"')
    text += lines({"gpu_umc_activity": 3}, no_uuid).replace('gpu_id="0"', 'gpu_id="2"')
    batches, stats, _ = scrape(text)
    assert [(s.gpu_uuid, s.gpu_index) for s in batches[0].samples] == [
        ("17ff74b5-0000-1000-805c-37b0fbe69430", 0),
        ("692409005408/1", 1),
    ]
    assert stats.anonymous == 1 and batches[0].node == "master-1"


def test_prefixed_and_upper_case_names_and_labels_are_read() -> None:
    old = 'gpu_power_usage{GPU_UUID="6699c0a8-4200-4242-037f-f97e6cae0f09",SERIAL_NUMBER="692247001282"} 41\n'
    assert canonical("amd_gpu_package_power") == "gpu_package_power"
    batches, _, _ = scrape(old + old.replace("gpu_power_usage", "amd_gpu_gfx_activity").replace("} 41", "} 9"))
    (s,) = batches[0].samples
    assert s.gpu_uuid == "6699c0a8-4200-4242-037f-f97e6cae0f09" and s.metrics["power_watts"] == 41.0
    assert s.metrics["utilization_gpu_percent"] == 9.0 and s.node == "fallback"


# --- throttling by cause --------------------------------------------------------------------------------------


def residency(percent: dict[str, float]) -> str:
    return lines({f"gpu_violation_{cause}_residency_percentage": v for cause, v in percent.items()})


def test_residency_percentages_become_clock_reasons_by_cause() -> None:
    m = one_gpu(residency({"ppt": 12.5, "socket_thermal": 0, "hbm_thermal": 0, "vr_thermal": 0, "processor_hot": 0}))
    assert decode_clock_reasons(int(m["throttle_reasons_mask"])) == ["SwPowerCap"]
    m = one_gpu(residency({"ppt": 0, "socket_thermal": 3, "vr_thermal": 1, "processor_hot": 2}))
    assert decode_clock_reasons(int(m["throttle_reasons_mask"])) == [
        "HwSlowdown",
        "SwThermalSlowdown",
        "HwThermalSlowdown",
    ]
    assert one_gpu(residency({"ppt": 0}))["throttle_reasons_mask"] == 0  # known and clear: 0, not absent
    assert "throttle_reasons_mask" not in one_gpu(lines({"gpu_gfx_activity": 1}))  # not known: absent


def test_accumulated_residency_counts_the_interval_between_scrapes() -> None:
    def counters(acc: int, ppt: int, hbm: int) -> str:
        return lines({
            "gpu_violation_current_accumulated_counter": acc,
            "gpu_violation_ppt_residency_accumulated": ppt,
            "gpu_violation_hbm_thermal_residency_accumulated": hbm,
        })  # fmt: skip

    state = ExporterState()
    assert "throttle_reasons_mask" not in one_gpu(counters(764653, 100, 7), state)  # first scrape: no interval
    assert decode_clock_reasons(int(one_gpu(counters(764700, 130, 7), state)["throttle_reasons_mask"])) == [
        "SwPowerCap"
    ]
    assert one_gpu(counters(764800, 130, 7), state)["throttle_reasons_mask"] == 0
    assert "throttle_reasons_mask" not in one_gpu(counters(10, 0, 0), state)  # counters reset: interval unknown


# --- AFIDs ----------------------------------------------------------------------------------------------------


def test_afids_are_typed_events_when_they_change() -> None:
    afids = lines({"gpu_afid_errors": 30}, afid_index="0", severity="fatal") + lines(
        {"gpu_afid_errors": 25}, afid_index="1", severity="fatal"
    )
    state = ExporterState()
    batches, _, _ = scrape(afids + lines({"gpu_gfx_activity": 1}), state)
    events = batches[0].events
    assert [(e.kind, e.code) for e in events] == [(EventKind.AFID, 25), (EventKind.AFID, 30)]
    assert all(e.detail.startswith("fatal: fatal hardware error (AFID") and "started" in e.detail for e in events)
    batches, _, _ = scrape(afids + lines({"gpu_gfx_activity": 1}), state)
    assert batches[0].events == ()  # the same last event: nothing new
    newer = afids.replace("} 25", "} 12").replace('severity="fatal"} 12', 'severity="non_fatal_corrected"} 12')
    batches, _, _ = scrape(newer + lines({"gpu_gfx_activity": 1}), state)
    ((event),) = batches[0].events
    assert event.code == 12 and event.detail.startswith("non_fatal_corrected: corrected error (AFID 12)")


# --- the source -----------------------------------------------------------------------------------------------


def test_the_source_scrapes_counts_and_rejects_malformed_text() -> None:
    bodies = [DOCS.read_bytes(), b'gpu_gfx_activity{gpu_id="0" 1\n']
    source = AmdExporterSource("http://x:5000/metrics", "dc1", "n1", fetch=lambda _u, _t: bodies.pop(0))
    source.open()
    (batch,) = source.collect(T0)
    assert batch.node == "xxxx" and source.topologies(T0)[0].gpus[0].uuid == "xxxx/0"
    stats = source.stats()
    assert (stats["scraped_series"], stats["mapped_series"], stats["unmapped_series"]) == (21, 2, 19)
    with pytest.raises(BadSourceData, match="line 1"):
        source.collect(T0 + 1)
    source.close()


def test_the_mapped_batches_pass_the_wire_and_the_processors_validation() -> None:
    now = time.time_ns()
    text = lines({name: printed for name, printed, _, _ in UNITS})
    text += lines({"gpu_afid_errors": 30}, afid_index="0", severity="fatal")
    batches, _, _ = scrape(text, ts_ns=now)
    decoded, rejected = decode_samples(encode_samples(batches[0]))
    assert rejected == [] and decoded == batches[0] and decoded.events[0].kind is EventKind.AFID
    raw = [RawMessage(b.kafka_key, encode_samples(b), f"raw/0/{i}") for i, b in enumerate(batches)]
    outcome = process_raw(raw, now, ValidationSettings())
    assert outcome.dead == [] and outcome.samples_ok == 1
