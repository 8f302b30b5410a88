"""The import loop (with a recording publisher): backfill headers, contexts delivered before the rows they cover,
duplicates and unreadable rows dead-lettered with their reason, and an interrupted import resumed where it stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import registry
from pipeline.codec import decode_record, decode_samples
from pipeline.config import Settings, TopicSettings
from pipeline.deadletter import headers_dict
from pipeline.events import GpuContext
from producers.importers.driver import Checkpoint, ImportDriver, Importer, import_key
from producers.importers.rows import Block
from tests import TESTDATA
from tests.fakes.kafka import RecordingPublisher

TOPICS = TopicSettings.with_prefix("t")
NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
XML = TESTDATA / "nvidia-smi-xml"


def importer(name: str, **options: object) -> Importer:
    built: Importer = registry.create("importer", name, Settings(cluster="dc1"), **options)
    built.open()
    return built


def test_rows_go_out_as_backfill_with_their_context_delivered_first(tmp_path: Path) -> None:
    lines = (NANOGPT / "gpu_metrics_f4f827dd.csv").read_text().splitlines()
    (tmp_path / "t.csv").write_text("\n".join([*lines[:17], lines[16]]) + "\n")  # the last row twice
    publisher = RecordingPublisher()
    source = importer("table", paths=(tmp_path / "t.csv",), mapping=NANOGPT / "mapping.toml")
    driver = ImportDriver(source, publisher, TOPICS, "dc1", "run-1")
    report = driver.run()
    assert report.rows_read == 17 and report.samples == 16 and report.rejected == {"duplicate": 1}
    topics = [m[0] for m in publisher.sent]
    # the dead letter, the 8 GPUs' contexts (delivered), then one message per node and timestamp
    assert topics == [TOPICS.dead_letter] + [TOPICS.context] * 8 + [TOPICS.raw] * 2
    contexts = [decode_record(GpuContext, m[2]) for m in publisher.on(TOPICS.context)]
    assert {c.workload.job_id for c in contexts if c.workload} == {"nanogpt-pr643"}
    assert all(c.ts_ns == 1_758_685_303_487_000_000 for c in contexts)  # the first row's time
    for _topic, _key, value, headers in publisher.on(TOPICS.raw):
        assert ("hermeneut-import", b"run-1") in headers
        batch, rejected = decode_samples(value)
        assert rejected == [] and len(batch.samples) == 8
        # two rows per GPU, 03:41:43.487 and 03:41:43.825 in the file: the interval detected is their gap
        assert {s.metrics["sample_interval_seconds"] for s in batch.samples} == {0.338}
    letter = headers_dict(publisher.on(TOPICS.dead_letter)[0][3])
    assert letter["hermeneut-reason"] == "duplicate" and letter["hermeneut-source"] == "t.csv:18"
    assert letter["hermeneut-import"] == "run-1" and letter["hermeneut-stage"] == "import"
    assert driver.raw_ends == {0: 2}


class Interrupted(Exception):
    pass


class StopsAfter:
    """An importer that fails after ``n`` blocks, as a killed import would."""

    def __init__(self, inner: Importer, n: int) -> None:
        self.inner, self.n, self.name = inner, n, inner.name

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def total_rows(self) -> int | None:
        return None

    def blocks(self) -> Iterator[Block]:
        for i, block in enumerate(self.inner.blocks()):
            if i == self.n:
                raise Interrupted
            yield block


def test_an_interrupted_import_resumes_where_it_stopped(tmp_path: Path) -> None:
    key = import_key("nvidia-smi-xml", "dc1", {"paths": (XML,)}, sorted(XML.glob("*.xml")))
    path = tmp_path / "imports" / f"{key}.json"
    first = RecordingPublisher()
    with pytest.raises(Interrupted):
        ImportDriver(StopsAfter(importer("nvidia-smi-xml", paths=(XML,)), 5), first, TOPICS, "dc1", "run-1",
                     Checkpoint.load(path, key)).run()  # fmt: skip
    assert Checkpoint.load(path, key).blocks_done == 5
    second = RecordingPublisher()
    report = ImportDriver(importer("nvidia-smi-xml", paths=(XML,)), second, TOPICS, "dc1", "run-2",
                          Checkpoint.load(path, key)).run()  # fmt: skip
    whole = RecordingPublisher()
    fresh = ImportDriver(importer("nvidia-smi-xml", paths=(XML,)), whole, TOPICS, "dc1", "run-3").run()
    # together the two runs sent exactly what one uninterrupted run sends, and the report adds up across them
    assert [m[2] for m in first.sent + second.sent] == [m[2] for m in whole.sent]
    assert (report.rows_read, report.samples, report.rejected) == (fresh.rows_read, fresh.samples, fresh.rejected)
    assert report.runs == ["run-1", "run-2"] and report.rows_read == 19
    restarted = Checkpoint.load(path, key, restart=True)
    assert restarted.blocks_done == 0 and restarted.report.rows_read == 0
    assert Checkpoint.load(path, "another-import").blocks_done == 0  # other files, options or cluster: not this one
