"""dcgm-exporter 4.8.x, 4.9.0, 4.10.0 and a scrape of both, through the live source (``hermeneut collect --source
dcgm-exporter``) and the saved-scrape importer (``hermeneut import dcgm-exporter``): every mapped field right in
value and unit, unknown fields counted and named once. What is real and what is built: tests/dcgm_scrapes.py."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from producers.dcgm_exporter import READ_METRICS, DcgmExporterSource, ScrapeStats, parse_exposition, to_batches
from producers.dcgm_names import IGNORED, NAMES, TABLE, XID, factor
from producers.importers.dcgm_files import DcgmFilesConfig, DcgmFilesImporter
from tests.dcgm_scrapes import (
    L40S,
    LEGACY_FIELDS,
    LEGACY_IGNORED,
    SI,
    T4,
    TAGS,
    Rename,
    aliases,
    as_generation,
    capture,
    counter_rows,
    expected,
    exposition,
    in_schema,
    mid_upgrade,
    renames,
)

T0 = 1_765_000_000_000_000_000

#: values of the renamed fields the two captures lack, each a real reading: of the quantity itself where a capture
#: has it (the Datadog T4 scrape, the A10G ``nvidia-smi -q -x``, the RTX 2080 SUPER and H100 ``nvidia-smi`` CSVs),
#: else of the same unit from the T4 scrape (marked "stand-in")
OTHER_VALUES = {
    "DCGM_FI_DEV_FB_TOTAL": 15109.0,  # dcgm-exporter-datadog-fixture, T4
    "DCGM_FI_DEV_SLOWDOWN_TEMP": 93.0,  # idem
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": 70.0,  # idem
    "DCGM_FI_DEV_PSTATE": 8.0,  # idem
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 300.0,  # nvidia-smi-xml/a10g.xml enforced_power_limit
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": 300.0,  # idem, default_power_limit
    "DCGM_FI_DEV_SHUTDOWN_TEMP": 98.0,  # idem, gpu_temp_max_threshold
    "DCGM_FI_DEV_FAN_SPEED": 38.0,  # nvidia-smi-csv/nvidia-geforce-rtx-2080-super-load.csv
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP": 74.0,  # stand-in: the T4's GPU temperature
    "DCGM_FI_DEV_XID_ERRORS": 0.0,  # dcgm-exporter-nvidia-cloud-native-docs, A100
    "DCGM_FI_DEV_RETIRED_SBE": 0.0,  # stand-in: counts of the H100 CSV (ECC, remapped rows) are 0
    "DCGM_FI_DEV_RETIRED_DBE": 0.0,
    "DCGM_FI_DEV_RETIRED_PENDING": 0.0,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0.0,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 0.0,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 0.0,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0.0,
    "DCGM_FI_PROF_SM_ACTIVE": 0.092781,  # stand-in: the T4's DRAM_ACTIVE
    "DCGM_FI_PROF_NVLINK_TX_BYTES": 4791810.0,  # stand-in: the T4's PCIe TX
    "DCGM_FI_PROF_NVLINK_RX_BYTES": 6935930.0,  # stand-in: the T4's PCIe RX
}


def collected(text: str) -> tuple[DcgmExporterSource, dict[str, dict[str, float]]]:
    """The live source's scrape of ``text``: the source (stats, topology) and each GPU's fields."""
    source = DcgmExporterSource("http://exporter:9400/metrics", "dc1", "fallback", fetch=lambda url, t: text.encode())
    batches = source.collect(T0)
    return source, {s.gpu_uuid: dict(s.metrics) for b in batches for s in b.samples}


def imported(text: str) -> dict[str, dict[str, float]]:
    """The same text through ``hermeneut import dcgm-exporter``'s reader: each GPU's row, its present fields."""
    block = DcgmFilesImporter(DcgmFilesConfig()).read(text.encode(), "scrape.prom", "fallback", T0)
    assert block.rejected == ()
    rows = block.rows
    return {
        uuid: {f: float(column[i]) for f, column in rows.metrics.items() if not math.isnan(column[i])}
        for i, uuid in enumerate(rows.gpu_uuid)
    }


def assert_fields(got: dict[str, float], want: dict[str, float]) -> None:
    assert {f: got.get(f) for f in want} == pytest.approx(want, rel=1e-9), sorted(set(want) - set(got))


def test_the_legacy_units_are_those_of_the_real_counters_files() -> None:
    """The unit the mapping assumes for each legacy name is the one dcgm-exporter's help text states."""
    for file in ("default-counters.csv", "dcp-metrics-included.csv"):
        rows = counter_rows(file)
        checked = [m for m in rows if m in NAMES]
        assert len(checked) >= 20, checked
        for metric in checked:
            assert NAMES[metric].unit == rows[metric][1], metric


def test_every_renamed_field_is_read_under_both_names_with_its_unit() -> None:
    pairs = aliases()
    for r in renames():
        if r.source.startswith("alias46"):
            assert (r.old, r.new) in pairs, f"{r.old} -> {r.new} is not one of DCGM 4.6.0's aliases"
        if r.old in IGNORED:
            assert r.new in IGNORED, r.new
            continue
        old, new = NAMES[r.old], NAMES[r.new]
        assert (old.field, old.part) == (new.field, new.part), r
        assert (old.unit, new.unit) == (r.old_unit, r.new_unit), r
        assert new.rank < old.rank, f"{r.new} should win over {r.old} in a scrape of both"
        # the mapping's factors agree with this test's own unit table
        assert new.factor == pytest.approx(old.factor * SI[r.new_unit] / SI[r.old_unit]), r


def test_a_unit_of_another_kind_than_the_field_fails_at_import() -> None:
    with pytest.raises(ValueError, match="cannot fill"):
        factor("MHz", "energy_joules")
    assert all(isinstance(names, tuple) and names for _, names in TABLE)


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("path", [T4, L40S], ids=["t4-under-load", "l40s-idle"])
def test_a_scrape_of_each_generation_maps_every_field(tag: str, path: Path) -> None:
    legacy = capture(path)
    text = exposition(as_generation(legacy, tag))
    want = expected(legacy)
    source, got = collected(text)
    assert set(got) == set(want)
    for uuid, fields in want.items():
        assert_fields(got[uuid], fields)
        assert_fields(imported(text)[uuid], fields)
    stats = source.stats()
    ignored = sum(s.name in LEGACY_IGNORED for s in legacy)
    assert stats == {
        "scraped_series": len(legacy), "unmapped_series": ignored, "ignored_series": ignored, "unknown_fields": 0,
        "duplicate_series": 0, "blank_values": 0,
    }  # fmt: skip
    # every series is mapped or known to have no place in the schema
    assert {s.name for s in legacy} <= set(LEGACY_FIELDS) | LEGACY_IGNORED | {"DCGM_FI_DEV_FB_FREE"}
    (topology,) = source.topologies(T0)
    assert topology.node == legacy[0].labels["Hostname"]
    assert topology.driver_version == legacy[0].labels["DCGM_FI_DRIVER_VERSION"]


@pytest.mark.parametrize("r", [r for r in renames() if r.old in OTHER_VALUES], ids=lambda r: r.new)
def test_each_renamed_field_outside_the_captures_maps_old_and_new_alike(r: Rename) -> None:
    value = OTHER_VALUES[r.old]
    labels = 'gpu="0",UUID="GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a",modelName="Tesla T4",Hostname="cp-bm14r7"'
    new_value = value * SI[r.old_unit] / SI[r.new_unit]
    name = NAMES[r.old]
    want = in_schema(value, r.old_unit, name.field)
    for text in (f"{r.old}{{{labels}}} {value!r}\n", f"{r.new}{{{labels}}} {new_value!r}\n"):
        last_xid: dict[str, float] = {}
        batches = to_batches(parse_exposition(text), "dc1", "n", T0, last_xid)
        if name.field == XID:
            assert last_xid == {"GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a": want}
            continue
        (sample,) = [s for b in batches for s in b.samples]
        assert sample.metrics[name.field] == pytest.approx(want), text


def test_a_scrape_mid_upgrade_takes_each_gpus_newest_name_and_counts_the_other() -> None:
    """The T4 in 4.8.2's names, the L40S in 4.10.0's with its legacy series still there (an exporter of each
    generation behind one scrape), in one text: each GPU right, the legacy duplicates counted, not mixed in."""
    mixed, stale = mid_upgrade()
    t4, l40s = capture(T4), capture(L40S)
    source, got = collected(exposition(mixed))
    want = expected(t4) | expected(l40s)
    for uuid, fields in want.items():
        assert_fields(got[uuid], fields)
        assert_fields(imported(exposition(mixed))[uuid], fields)
    stats = source.scrape_stats
    assert stats.duplicate == stale > 10
    # one series per field each GPU got, memory total standing for the free-memory series it is computed from
    used = sum(len(fields) for fields in want.values())
    assert stats.samples == len(mixed) == stats.unmapped + stats.duplicate + stats.blank + stats.anonymous + used
    assert {t.node for t in source.topologies(T0)} <= {"cp-bm14r7", "gpu1-wl8sg"}


def test_an_unknown_field_is_counted_every_time_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    text = exposition(capture(T4)) + (
        'DCGM_FI_DEV_FUTURE_THING{gpu="0",UUID="GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"} 1\n'
        'DCGM_FI_DEV_FUTURE_THING{gpu="1",UUID="GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469b"} 2\n'
    )
    stats = ScrapeStats()
    with caplog.at_level(logging.WARNING, logger="producers.dcgm_exporter"):
        for _ in range(3):
            to_batches(parse_exposition(text), "dc1", "n", T0, {}, stats)
    named = [r for r in caplog.records if "DCGM_FI_DEV_FUTURE_THING" in r.getMessage()]
    assert len(named) == 1
    assert stats.unknown == {"DCGM_FI_DEV_FUTURE_THING"}
    assert stats.unmapped - stats.ignored == 6


def test_the_prometheus_import_asks_for_the_names_of_every_generation() -> None:
    asked = set(READ_METRICS)
    for r in renames():
        if r.old not in IGNORED:
            assert {r.old, r.new} <= asked, r
