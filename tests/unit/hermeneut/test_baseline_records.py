"""What the training job writes and the sink stores: baseline bands in the units of the stored fields,
feedback points, event ids, and the interpretation fields of ``gpu`` points."""

from __future__ import annotations

import numpy as np
import pytest

from hermeneut.jobs.training import bands
from pipeline.baselines import BaselineBand, Feedback, event_id, parse_event_id
from pipeline.events import Driver, GpuSample, InterpretedBatch, InterpretedEvent, Verdict, Workload
from processors.baselines.fit import fit_baseline
from processors.features import FEATURE_NAMES, link_capacity
from sinks.influxdb.lines import baseline_band_line, batch_lines, feedback_line

H100 = "NVIDIA H100 80GB HBM3"


def _record(model: str | None):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    x = np.full((500, len(FEATURE_NAMES)), np.nan)
    x[:, FEATURE_NAMES.index("power_ratio_of_limit")] = rng.normal(0.8, 0.05, 500)
    x[:, FEATURE_NAMES.index("pcie_rx_ratio_of_capacity")] = rng.normal(0.1, 0.01, 500)
    x[:, FEATURE_NAMES.index("utilization_gpu_percent")] = rng.normal(90, 3, 500)
    record = fit_baseline(x, "llm-serving", model, "compute", 7, 1_700_000_000_000_000_000)
    assert record is not None
    return record


def test_bands_are_in_the_units_of_the_stored_fields() -> None:
    by_feature = {b.feature: b for b in bands(_record(H100))}
    assert set(by_feature) == {"utilization_gpu_percent", "power_ratio_of_limit", "pcie_rx_bytes_per_second"}
    pcie = by_feature["pcie_rx_bytes_per_second"]
    capacity = link_capacity(H100, "pcie_rx_ratio_of_capacity")
    assert capacity == pytest.approx(3.938e9 * 16)
    assert pcie.p50 == pytest.approx(0.1 * capacity, rel=0.02)
    assert 85 < by_feature["utilization_gpu_percent"].p05 < 90 < by_feature["utilization_gpu_percent"].p95
    assert pcie.p01 < pcie.p05 < pcie.p50 < pcie.p95 < pcie.p99
    assert (pcie.version, pcie.n, pcie.gpu_model, pcie.phase) == (7, 500, H100, "compute")


def test_prior_bands_keep_ratios_and_a_star_model() -> None:
    by_feature = {b.feature: b for b in bands(_record(None))}
    assert "pcie_rx_ratio_of_capacity" in by_feature  # no single link capacity behind a prior
    assert {b.gpu_model for b in by_feature.values()} == {"*"}


def test_band_and_feedback_lines() -> None:
    band = BaselineBand("llm-serving", H100, "compute", "power_ratio_of_limit", 0.1, 0.2, 0.5, 0.8, 0.9, 42, 3, 10**18)
    assert baseline_band_line(band) == (
        r"baseline,application=llm-serving,feature=power_ratio_of_limit,gpu_model=NVIDIA\ H100\ 80GB\ HBM3,"
        "phase=compute p01=0.1,p05=0.2,p50=0.5,p95=0.8,p99=0.9,n=42.0,version=3.0 1000000000000"
    )
    fb = Feedback("GPU-1@1700000000123", "dc1", "n1", "GPU-1", 1700000000123, "not-anomalous", 2 * 10**18,
                  "llm-serving", H100, 'fine "really"', "ana")  # fmt: skip
    line = feedback_line(fb)
    assert line.startswith(
        r"feedback,application=llm-serving,cluster=dc1,gpu=GPU-1,gpu_model=NVIDIA\ H100\ 80GB\ HBM3 "
    )
    assert 'verdict="not-anomalous",note="fine \\"really\\"",user="ana",event_ts_ms=1700000000123.0' in line
    assert line.endswith(" 2000000000000")


def test_event_ids_round_trip() -> None:
    eid = event_id("MIG-GPU-a/1/2", 1_700_000_000_123_999_999)
    assert eid == "MIG-GPU-a/1/2@1700000000123"
    assert parse_event_id(eid) == ("MIG-GPU-a/1/2", 1700000000123)
    with pytest.raises(ValueError, match="is not"):
        parse_event_id("GPU-1@")


def test_interpretation_fields_are_stored_and_normal_rows_stay_small() -> None:
    sample = GpuSample("c", "n", "GPU-1", 0, H100, 1_700_000_000_000_000_000, {"power_watts": 300.0})
    off = InterpretedEvent(
        sample, {}, Workload("llm-serving", source="inferred", confidence=0.93), 9.5, Verdict.ANOMALOUS,
        f"llm-serving/{H100}/compute", "power 38% of limit: anomalous", "compute",
        (Driver("power_ratio_of_limit", 0.38, 0.8, 0.6, 0.9),),
    )  # fmt: skip
    normal = InterpretedEvent(sample, {}, Workload("llm-serving", source="slurm", confidence=1.0), 0.1, Verdict.NORMAL,
                              f"llm-serving/{H100}/compute", "", "compute")  # fmt: skip
    a, b = batch_lines([InterpretedBatch.from_events([off, normal])])
    assert 'app_source="inferred",app_confidence=0.93' in a
    assert 'phase="compute",baseline="llm-serving/NVIDIA H100 80GB HBM3/compute"' in a
    assert 'explanation="power 38% of limit: anomalous"' in a
    assert 'drivers="power_ratio_of_limit=0.38 (p50 0.8, p5..p95 0.6..0.9)"' in a
    assert "explanation=" not in b and "drivers=" not in b
