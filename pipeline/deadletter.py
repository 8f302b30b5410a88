"""The dead-letter record: the original bytes of a rejected message plus headers saying why and from where.

Headers (all UTF-8): ``hermeneut-reason`` (short stable code, e.g. ``nan``, ``malformed``, ``future_timestamp``),
``hermeneut-detail`` (one human line), ``hermeneut-stage`` (processor / sink), ``hermeneut-source``
(topic/partition/offset of the original), ``hermeneut-gpu`` (when one sample of a node batch was rejected),
``hermeneut-position`` (its index in the batch), ``hermeneut-part`` (which list of the node message that
index is in: ``sample``, ``event`` or ``nic``) and ``hermeneut-import`` (the import run that published the
original, for imported history). One record per rejected item, so counts add up.

Bounded (:func:`bounded`): the original is stored once per source message. The first dead letter of a source
carries it (``hermeneut-payload: original``), or, where the original and the headers would not fit the
dead-letter topic, its first bytes (``truncated``); the others of the same source carry no bytes (``elsewhere``:
the original is in the first one, and in its source topic at ``hermeneut-source``). Each says the original's
size and SHA-256 (``hermeneut-size``, ``hermeneut-sha256``), so 20 bad GPUs in a 530 kB message cost 530 kB
and 19 small records, not 10.6 MB, and a message just under the limit still gets its dead letter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pipeline.sizing import margin, record_size

REASON = "hermeneut-reason"
DETAIL = "hermeneut-detail"
STAGE = "hermeneut-stage"
SOURCE = "hermeneut-source"
GPU = "hermeneut-gpu"
POSITION = "hermeneut-position"
PART = "hermeneut-part"
IMPORT = "hermeneut-import"
PAYLOAD = "hermeneut-payload"
SIZE = "hermeneut-size"
SHA256 = "hermeneut-sha256"
#: what the value of a dead letter holds (header ``hermeneut-payload``)
ORIGINAL, TRUNCATED, ELSEWHERE = b"original", b"truncated", b"elsewhere"
#: header values (a GPU uuid, a detail) and keys are cut to this much: they come from the input, unbounded
_HEADER_MAX: Final = 500
_KEY_MAX: Final = 4096


@dataclass(frozen=True, slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]

    @property
    def reason(self) -> str:
        return dict(self.headers)[REASON].decode()


def dead_letter(
    key: bytes | None,
    original: bytes,
    reason: str,
    detail: str,
    stage: str,
    source: str,
    gpu_uuid: str | None = None,
    position: int | None = None,
    part: str = "sample",
    import_run: str | None = None,
) -> DeadLetter:
    headers = [
        (REASON, reason.encode()[:_HEADER_MAX]),
        (DETAIL, detail.encode()[:_HEADER_MAX]),
        (STAGE, stage.encode()),
        (SOURCE, source.encode()[:_HEADER_MAX]),
    ]
    if gpu_uuid is not None:
        headers.append((GPU, gpu_uuid.encode(errors="replace")[:_HEADER_MAX]))
    if position is not None:
        headers.append((POSITION, str(position).encode()))
        headers.append((PART, part.encode()))
    if import_run is not None:
        headers.append((IMPORT, import_run.encode()[:_HEADER_MAX]))
    return DeadLetter(key, original, headers)


def bounded(letters: Sequence[DeadLetter], limit: int) -> list[DeadLetter]:
    """The letters as records that fit a dead-letter topic of ``limit`` bytes (see the module docstring): the
    original once per source, truncated where it must be; one record per letter still, in order."""
    out: list[DeadLetter] = []
    first: dict[bytes, tuple[int, str]] = {}  # source -> (size, sha256) of the original already carried
    for letter in letters:
        headers = dict(letter.headers)
        source = headers.get(SOURCE, b"")
        key = None if letter.key is None else letter.key[:_KEY_MAX]
        seen = first.get(source)
        if seen is not None and source:
            size, digest = seen
            out.append(DeadLetter(key, b"", [*letter.headers, *_payload(ELSEWHERE, size, digest)]))
            continue
        size, digest = len(letter.value), hashlib.sha256(letter.value).hexdigest()
        first[source] = (size, digest)
        # sized with the longer of the two payload headers, so either choice fits
        room = limit - margin(limit) - record_size(key, 0, [*letter.headers, *_payload(TRUNCATED, size, digest)])
        if size <= room:
            out.append(DeadLetter(key, letter.value, [*letter.headers, *_payload(ORIGINAL, size, digest)]))
        else:
            value = letter.value[: max(room, 0)]
            out.append(DeadLetter(key, value, [*letter.headers, *_payload(TRUNCATED, size, digest)]))
    return out


def _payload(kind: bytes, size: int, digest: str) -> list[tuple[str, bytes]]:
    return [(PAYLOAD, kind), (SIZE, str(size).encode()), (SHA256, digest.encode())]


def headers_dict(headers: list[tuple[str, bytes]] | None) -> dict[str, str]:
    """Decode a consumed record's headers (for tools and tests reading the dead-letter topic)."""
    return {k: (v or b"").decode(errors="replace") for k, v in headers or []}
