"""Wire encoding of the schema: MessagePack, one message per node per sampling round.

Why MessagePack (``bench/codec.py``, numbers in the README): it keeps int64 timestamps and float64 values exact,
can carry NaN (so a NaN from a broken sensor reaches validation and the dead-letter topic instead of vanishing
as JSON ``null``), carries binary buffers, and is ~12% smaller than JSON after lz4. It is not faster than orjson
(encode ties, parsing is ~1.5x slower); that cost is small next to what the schema buys.

Raw samples come in two forms, both schema version 1. hermeneut's own producers write them *column-wise*: one
list per identity field (``uuid``, ``index``, ``model``, ``ts_ns``), the message's metric names once in ``fields``,
the readings in ``m`` as one little-endian float64 buffer (a row per sample, a column per name) and, only when
some sample lacks some field, ``unsent``: a byte per cell, non-zero where the field was not sent (a NaN that was
sent stays a reading). Anyone else may write them *row-wise*, a map per sample under ``samples`` (easy to write,
absent fields simply missing). The columns spare the processor a map, a key string and an object per value and an
object per sample: it builds its matrix straight from the buffers (:func:`decode_raw`, ``processors.normalize``),
and the message is 40% of the size. Interpreted
batches, written and read only by hermeneut stages, are column-wise too, with the numeric columns as float64
buffers, so neither the processor nor the sink builds a Python object per value.

Decoding is defensive: a message whose envelope is broken raises :class:`DecodeError` (the whole message is
dead-lettered); a message with some broken samples decodes into the good ones plus a :class:`Rejected` entry
per broken sample (or event, or NIC reading), so one bad GPU does not cost its node's other readings.

Low-rate records (workload context, topology, findings, ground truth) use :func:`encode_record` /
:func:`decode_record`: the dataclass's fields as a map, checked against its type hints on the way in.
"""

from pipeline.codec.interpreted import decode_interpreted, encode_interpreted
from pipeline.codec.records import decode_record, encode_record
from pipeline.codec.rows import CONTENT_TYPE, INT64_MAX, Rejected
from pipeline.codec.samples import (
    RawSamples,
    ValueGroup,
    decode_raw,
    decode_samples,
    encode_samples,
    sample_columns,
    sample_rows,
)

__all__ = [
    "CONTENT_TYPE",
    "INT64_MAX",
    "RawSamples",
    "Rejected",
    "ValueGroup",
    "decode_interpreted",
    "decode_raw",
    "decode_record",
    "decode_samples",
    "encode_interpreted",
    "encode_record",
    "encode_samples",
    "sample_columns",
    "sample_rows",
]
