"""The dead-letter record: the original bytes of a rejected message plus headers saying why and from where.

Headers (all UTF-8): ``hermeneut-reason`` (short stable code, e.g. ``nan``, ``malformed``, ``future_timestamp``),
``hermeneut-detail`` (one human line), ``hermeneut-stage`` (processor / sink), ``hermeneut-source``
(topic/partition/offset of the original), ``hermeneut-gpu`` (when one sample of a node batch was rejected),
``hermeneut-position`` (its index in the batch), ``hermeneut-part`` (which list of the node message that
index is in: ``sample``, ``event`` or ``nic``) and ``hermeneut-import`` (the import run that published the
original, for imported history). One record per rejected item, so counts add up.
"""

from __future__ import annotations

from dataclasses import dataclass

REASON = "hermeneut-reason"
DETAIL = "hermeneut-detail"
STAGE = "hermeneut-stage"
SOURCE = "hermeneut-source"
GPU = "hermeneut-gpu"
POSITION = "hermeneut-position"
PART = "hermeneut-part"
IMPORT = "hermeneut-import"


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
        (REASON, reason.encode()),
        (DETAIL, detail.encode()[:500]),
        (STAGE, stage.encode()),
        (SOURCE, source.encode()),
    ]
    if gpu_uuid is not None:
        headers.append((GPU, gpu_uuid.encode()))
    if position is not None:
        headers.append((POSITION, str(position).encode()))
        headers.append((PART, part.encode()))
    if import_run is not None:
        headers.append((IMPORT, import_run.encode()))
    return DeadLetter(key, original, headers)


def headers_dict(headers: list[tuple[str, bytes]] | None) -> dict[str, str]:
    """Decode a consumed record's headers (for tools and tests reading the dead-letter topic)."""
    return {k: (v or b"").decode(errors="replace") for k, v in headers or []}
