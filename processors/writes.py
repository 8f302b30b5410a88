"""What the processor writes for one take of raw messages, every record sized to the cluster's limits; pure apart
from the interpretation's own state (no I/O: processors/app.py sends what this returns).

Per source partition: the normalized batch is interpreted, and its rows and node-level extras are encoded in as
few interpreted records as fit the topic (:func:`pipeline.sizing.fit`: rows, events and NIC readings cut in
proportion, so no part carries all the extras). A row (or extra) that alone does not fit is dead-lettered
(``too_large``) with its message's source offset and position, never retried. Findings go to the alerts topic
(one that does not fit is dead-lettered the same way). Every dead letter is bounded
(:func:`pipeline.deadletter.bounded`): the original once per source message, truncated with its size and hash
where it must be.

Decoding and validation are total (any input is stored items plus dead letters), so a take that raises has met a
bug in interpretation: the take is bisected, the messages that still raise alone are dead-lettered
(``processing_error``, with the exception) and the others are processed as usual.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pipeline.codec import encode_interpreted, encode_record
from pipeline.config import TopicSettings, ValidationSettings
from pipeline.deadletter import DeadLetter, bounded, dead_letter
from pipeline.events import Finding, InterpretedBatch
from pipeline.sizing import Cut, Limits, fit
from processors.interpret import Interpreter
from processors.normalize import STAGE, Origins, RawMessage, process_raw

log = logging.getLogger(__name__)

_PARTS = ("sample", "event", "nic")


@dataclass(frozen=True, slots=True)
class Write:
    """One record to send; ``source`` names what it came from (for a stall's log line)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None
    source: str = ""


@dataclass
class TakeResult:
    """The records of one take, in the order to send them, and what they count."""

    writes: list[Write] = field(default_factory=list)
    samples_ok: int = 0
    dead_lettered: int = 0
    findings: int = 0
    interpreted: int = 0
    too_large: int = 0
    processing_errors: int = 0
    #: what the writes carry, for the interpretation metrics: the interpreted batches, the findings sent and the
    #: dead letters
    batches: list[InterpretedBatch] = field(default_factory=list)
    sent_findings: list[Finding] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)

    def add(self, other: TakeResult) -> None:
        self.writes += other.writes
        self.batches += other.batches
        self.sent_findings += other.sent_findings
        self.letters += other.letters
        for name in ("samples_ok", "dead_lettered", "findings", "interpreted", "too_large", "processing_errors"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class TakeWriter:
    """Turns takes of raw messages into sized records (see the module docstring)."""

    def __init__(
        self,
        topics: TopicSettings,
        limits: Limits,
        validation: ValidationSettings,
        interpreter: Interpreter,
        out_partitions: int,
    ) -> None:
        self.topics, self.limits, self.validation = topics, limits, validation
        self.interpreter, self.out_partitions = interpreter, out_partitions
        self.interpreted_budget = limits.value_budget(topics.interpreted)

    def take(self, messages: list[RawMessage], now_ns: int) -> TakeResult:
        """The records for ``messages``; never raises (see the module docstring)."""
        try:
            return self._take(messages, now_ns)
        except Exception as exc:
            log.exception("processing a take of %d messages failed; bisecting it", len(messages))
            return self._bisect(messages, now_ns, exc)

    def _bisect(self, messages: list[RawMessage], now_ns: int, exc: Exception) -> TakeResult:
        if len(messages) == 1:
            (msg,) = messages
            detail = f"{type(exc).__name__}: {exc}"
            letters = [dead_letter(msg.key, msg.value, "processing_error", detail, STAGE, msg.source)]
            out = TakeResult(processing_errors=1)
            self._letters(letters, out)
            return out
        out = TakeResult()
        half = len(messages) // 2
        for part in (messages[:half], messages[half:]):
            try:
                out.add(self._take(part, now_ns))
            except Exception as inner:
                out.add(self._bisect(part, now_ns, inner))
        return out

    def _take(self, messages: list[RawMessage], now_ns: int) -> TakeResult:
        out = TakeResult()
        outcome = process_raw(messages, now_ns, self.validation)
        out.samples_ok = outcome.samples_ok
        letters = list(outcome.dead)
        for partition, normalized in outcome.forward:
            batch, findings = self.interpreter.apply(normalized, now_ns)
            out.batches.append(batch)
            origins = outcome.origins.get(partition, Origins())
            letters += self.parts(batch, partition, origins, messages, out)
            self.findings(findings, out)
        self._letters(letters, out)
        return out

    def parts(
        self,
        batch: InterpretedBatch,
        partition: int,
        origins: Origins,
        messages: list[RawMessage],
        out: TakeResult,
    ) -> list[DeadLetter]:
        """The batch's interpreted records (into ``out``); dead letters for what does not fit alone."""

        def encode(cut: Cut) -> bytes:
            rows, events, nics = cut
            return encode_interpreted(batch.take(rows, extras=(events, nics)))

        fitted = fit((len(batch), len(batch.gpu_events), len(batch.nics)), encode, self.interpreted_budget)
        source = f"{self.topics.raw}/{partition}"
        out.writes += [
            Write(self.topics.interpreted, None, part, partition=partition % self.out_partitions, source=source)
            for part in fitted.parts
        ]
        out.interpreted += len(fitted.parts)
        letters = []
        for which, item in fitted.too_large:
            index, position = (origins.rows, origins.events, origins.nics)[which][item]
            msg = messages[index]
            uuid = batch.gpu_uuid[item] if which == 0 else batch.gpu_events[item].gpu_uuid if which == 1 else None
            if which == 0:
                out.samples_ok -= 1  # validated, but it cannot be written: counted as dead-lettered instead
            detail = f"its interpreted record alone is over the {self.topics.interpreted} budget of "
            detail += f"{self.interpreted_budget} bytes"
            letters.append(
                dead_letter(msg.key, msg.value, "too_large", detail, STAGE, msg.source, uuid, position, _PARTS[which])
            )
        out.too_large += len(fitted.too_large)
        return letters

    def findings(self, findings: list[Finding], out: TakeResult) -> None:
        """The findings' records (into ``out``); a finding too large for the alerts topic is dead-lettered."""
        letters = []
        for finding in findings:
            key, value = finding.dedup_key.encode(), encode_record(finding)
            if self.limits.fits(self.topics.alerts, key, value):
                out.writes.append(Write(self.topics.alerts, key, value, source=f"finding {finding.dedup_key}"))
                out.sent_findings.append(finding)
                out.findings += 1
            else:
                detail = f"finding of {len(value)} bytes is over the {self.topics.alerts} budget"
                letters.append(dead_letter(key, value, "too_large", detail, STAGE, f"finding/{finding.dedup_key}"))
                out.too_large += 1
        self._letters(letters, out)

    def _letters(self, letters: list[DeadLetter], out: TakeResult) -> None:
        topic = self.topics.dead_letter
        for letter in bounded(letters, self.limits.limit(topic)):
            source = dict(letter.headers).get("hermeneut-source", b"").decode(errors="replace")
            out.writes.append(Write(topic, letter.key, letter.value, letter.headers, source=source))
        out.dead_lettered += len(letters)
        out.letters += letters
