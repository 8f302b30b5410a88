"""dcgm-exporter's /metrics as a source: strict exposition parsing and the mapping to our schema."""

from __future__ import annotations

import time

import pytest

from pipeline.codec import encode_samples
from pipeline.config import ValidationSettings
from pipeline.errors import BadSourceData, DecodeError, SourceUnavailable
from pipeline.events import METRIC_INDEX, EventKind
from processors.normalize import RawMessage, process_raw
from producers.dcgm_exporter import DcgmExporterSource, ScrapeStats, is_blank, parse_exposition, to_batches
from tests import TESTDATA

SAMPLE = TESTDATA / "dcgm-exporter" / "a100-mig-node.txt"
MIB = 2**20
GIB = 2**30
T0 = 1_700_000_000_000_000_000
GPU0 = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
GPU1 = "GPU-8f6c1b2e-0d4a-4c55-9e1f-5a0b7c3d2e91"
MIG = f"MIG-{GPU0}/13"


def scrape(text: str | None = None, last_xid: dict[str, float] | None = None) -> tuple[dict, list, ScrapeStats]:  # type: ignore[type-arg]
    stats = ScrapeStats()
    batches = to_batches(
        parse_exposition(text or SAMPLE.read_text()), "dc1", "fallback", T0, {} if last_xid is None else last_xid, stats
    )
    samples = {s.gpu_uuid: s for b in batches for s in b.samples}
    return samples, batches, stats


def test_parser_reads_names_labels_values_and_escapes() -> None:
    text = (
        "# HELP x_total a counter\n# TYPE x_total counter\n"
        'x_total{a="1",b="q\\"uote\\\\n\\n"} 1.5e3 1700000000000\n'
        "up 1\n"
        'spaced{gpu="0", UUID="GPU-1"} -Inf\n'
    )
    samples = parse_exposition(text)
    assert [(s.name, s.labels, s.value, s.line) for s in samples[:2]] == [
        ("x_total", {"a": "1", "b": 'q"uote\\n\n'}, 1500.0, 3),
        ("up", {}, 1.0, 4),
    ]
    assert samples[2].labels == {"gpu": "0", "UUID": "GPU-1"}


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ('ok 1\nDCGM_FI_DEV_GPU_TEMP{gpu="0"}\n', 2, "not a sample"),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="unterminated} 5\n', 1, "label"),
        ("DCGM_FI_DEV_GPU_TEMP{gpu=0} 5\n", 1, "label"),
        ("DCGM_FI_DEV_GPU_TEMP 5 six\n", 1, "not a sample"),
        ("DCGM_FI_DEV_GPU_TEMP fifty\n", 1, "not a number"),
        ('a{x="1"} 1\nb 2\na{x="1"} 3\n', 3, "repeats"),
        ('a{x="1",x="2"} 1\n', 1, "twice"),
        ("# TYPE a countre\n", 1, "type"),
        ("\n\ngarbage line\n", 3, "not a number"),
        ("\n\nno_value_here\n", 3, "not a sample"),
    ],
)
def test_malformed_exposition_names_the_line(text: str, line: int, what: str) -> None:
    with pytest.raises(DecodeError) as err:
        parse_exposition(text)
    assert err.value.reason == "malformed"
    assert err.value.detail.startswith(f"line {line}:") and what in err.value.detail


def test_dcgm_blank_values() -> None:
    assert is_blank(9223372036854775794)  # DCGM_INT64_NOT_SUPPORTED, as dcgm-exporter's README shows it
    assert is_blank(140737488355330.0)  # DCGM_FP64_NOT_SUPPORTED
    assert is_blank(2147483634)  # DCGM_INT32_NOT_SUPPORTED
    assert is_blank(float("nan"))
    assert not is_blank(0) and not is_blank(409.692) and not is_blank(319159391)


def test_the_sample_scrape_maps_to_our_fields_and_units() -> None:
    samples, batches, stats = scrape()
    assert [b.node for b in batches] == ["ub20-a100-k8s"]
    assert set(samples) == {GPU0, GPU1, MIG}
    gpu0 = samples[GPU0]
    assert (gpu0.gpu_index, gpu0.gpu_model) == (0, "NVIDIA A100-SXM4-40GB")
    m = gpu0.metrics
    assert m["sm_clock_mhz"] == 1215 and m["memory_clock_mhz"] == 1215
    assert m["temperature_gpu_celsius"] == 61 and m["temperature_memory_celsius"] == 69
    assert m["power_watts"] == pytest.approx(409.692)
    assert m["energy_joules"] == pytest.approx(319159.391)
    assert m["memory_used_bytes"] == 4845 * MIB and m["memory_total_bytes"] == (4845 + 35690) * MIB
    assert m["tensor_active_percent"] == pytest.approx(92.926)
    assert m["dram_active_percent"] == pytest.approx(69.0789)
    assert m["pcie_tx_bytes_per_second"] == 33011804 and m["pcie_rx_bytes_per_second"] == 97863601
    # limits the default counters do not carry: the catalogue's A100-SXM4-40GB
    assert m["power_limit_watts"] == 400 and m["sm_clock_max_mhz"] == 1410 and m["pcie_link_gen_max"] == 4
    assert set(m) <= set(METRIC_INDEX)
    gpu1 = samples[GPU1].metrics
    assert "temperature_memory_celsius" not in gpu1  # DCGM's NOT_SUPPORTED marker: absent, not 9.2e18
    assert gpu1["memory_total_bytes"] == 40 * GIB  # used 0 + free 40328 + reserved 632 MiB
    assert gpu1["row_remap_correctable_total"] == 2 and gpu1["utilization_gpu_percent"] == 0
    mig = samples[MIG]
    assert mig.gpu_model == "NVIDIA A100-SXM4-40GB MIG 1g.5gb" and mig.gpu_index == 0
    assert mig.metrics == pytest.approx(
        {"tensor_active_percent": 93.0433, "dram_active_percent": 80.0339, "memory_total_bytes": 5 * GIB}
    )
    assert stats.unmapped == 5 and stats.blank == 1  # GR_ENGINE x2, ENC_UTIL, NVLINK_BANDWIDTH, VGPU_LICENSE


def test_xid_events_when_the_last_xid_changes() -> None:
    last: dict[str, float] = {}
    _, batches, _ = scrape(last_xid=last)
    events = batches[0].events
    assert [(e.gpu_uuid, e.kind, e.code) for e in events] == [(GPU1, EventKind.XID, 79)]
    assert "started" in events[0].detail
    _, batches, _ = scrape(last_xid=last)
    assert batches[0].events == ()  # same last XID: nothing new
    text = SAMPLE.read_text().replace(
        'Hostname="ub20-a100-k8s",DCGM_FI_DRIVER_VERSION="535.104.05"} 0\nDCGM_FI_DEV_XID_ERRORS{gpu="1"',
        'Hostname="ub20-a100-k8s",DCGM_FI_DRIVER_VERSION="535.104.05"} 13\nDCGM_FI_DEV_XID_ERRORS{gpu="1"',
    )
    _, batches, _ = scrape(text, last_xid=last)
    assert [(e.gpu_uuid, e.code, e.detail) for e in batches[0].events] == [(GPU0, 13, "")]


def test_the_mapped_batches_pass_the_processors_validation() -> None:
    now = time.time_ns()
    batches = to_batches(parse_exposition(SAMPLE.read_text()), "dc1", "x", now, {})
    raw = [RawMessage(b.kafka_key, encode_samples(b), f"raw/0/{i}") for i, b in enumerate(batches)]
    outcome = process_raw(raw, now, ValidationSettings())
    assert outcome.dead == [] and outcome.samples_ok == 3


def test_series_without_hostname_use_the_configured_node_and_anonymous_ones_are_counted() -> None:
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-x"} 40\nDCGM_FI_DEV_GPU_TEMP{gpu="1"} 41\nup 1\n'
    samples, batches, stats = scrape(text)
    assert [b.node for b in batches] == ["fallback"]
    assert samples["GPU-x"].metrics == {"temperature_gpu_celsius": 40}  # unknown model: nothing from the catalogue
    assert (stats.anonymous, stats.unmapped) == (1, 1)


def test_the_source_scrapes_maps_and_dead_letters_bad_text() -> None:
    answers = [SAMPLE.read_bytes(), b"DCGM_FI_DEV_GPU_TEMP{gpu=0} 1\n"]
    source = DcgmExporterSource("http://exporter:9400/metrics", "dc1", "n1", fetch=lambda url, t: answers.pop(0))
    (batch,) = source.collect(T0)
    assert len(batch.samples) == 3
    (topology,) = source.topologies(T0)
    assert topology is not None and topology.node == "ub20-a100-k8s"
    assert {(g.uuid, g.parent_uuid, g.pci_bus_id) for g in topology.gpus} == {
        (GPU0, None, "0000:07:00.0"),
        (GPU1, None, "0000:0f:00.0"),
        (MIG, GPU0, "0000:07:00.0"),
    }
    with pytest.raises(BadSourceData) as err:
        source.collect(T0 + 10**9)
    assert err.value.payload == b"DCGM_FI_DEV_GPU_TEMP{gpu=0} 1\n" and err.value.origin.startswith("http://")
    assert err.value.detail.startswith("line 1:")


def test_an_unreachable_exporter_is_a_transient_failure() -> None:
    source = DcgmExporterSource("http://127.0.0.1:9/metrics", "dc1", "n1", timeout_s=0.5)
    with pytest.raises(SourceUnavailable):
        source.collect(T0)


def test_a_long_run_of_digits_is_refused() -> None:
    """131,073 digits and a letter (a field over the CSV limit of issue 37) took minutes with the old pattern, which
    could split its digits many ways; the grammar has one way now. Refused, and well-formed numbers still read."""
    from producers.dcgm_exporter import _float

    with pytest.raises(ValueError):
        _float("1" * 131_073 + "x")
    assert [_float(s) for s in ("1", "1.", "1.5", ".5", "-2e3")] == [1.0, 1.0, 1.5, 0.5, -2000.0]
