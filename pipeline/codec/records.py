"""Low-rate records (workload context, topology, findings, ground truth): a dataclass's fields as a map, checked
against its type hints on the way in.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, Final, TypeVar, cast

import msgpack

from pipeline.codec.rows import unpack
from pipeline.errors import DecodeError, InvalidEvent
from pipeline.events import (
    SCHEMA_VERSION,
)

R = TypeVar("R")


#: a decoder per type hint: ``(value, where) -> decoded``, raising InvalidEvent with ``where`` in its detail
Decoder = Callable[[Any, str], Any]


_DECODERS: dict[Any, Decoder] = {}


_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def to_wire(value: Any) -> Any:
    if type(value) in _SCALARS:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    return value


def _decoder(hint: Any) -> Decoder:
    """The decoder of ``hint``, built once: walking the type hints for every value was most of what decoding a
    workload cost (the sink decodes one per distinct workload of every interpreted message)."""
    decode = _DECODERS.get(hint)
    if decode is None:
        decode = _DECODERS[hint] = _build(hint)
    return decode


def _build(hint: Any) -> Decoder:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        decode_inner = _decoder(inner)
        if type(None) not in typing.get_args(hint):
            return decode_inner
        return lambda value, where: None if value is None else decode_inner(value, where)
    if origin is tuple:
        return _tuple_of(_decoder(typing.get_args(hint)[0]))
    if origin is dict:
        return _dict_of(*map(_decoder, typing.get_args(hint)))
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _enum(hint)
    if dataclasses.is_dataclass(hint):
        return _dataclass(cast(type, hint))
    if hint is float:
        return _float
    if hint is Any:
        return lambda value, where: value
    return _exactly(hint)


def _tuple_of(item: Decoder) -> Decoder:
    def decode(value: Any, where: str) -> tuple[Any, ...]:
        if type(value) is not list:
            raise InvalidEvent("wrong_type", f"{where} must be a list")
        return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))

    return decode


def _dict_of(key: Decoder, val: Decoder) -> Decoder:
    def decode(value: Any, where: str) -> dict[Any, Any]:
        if type(value) is not dict:
            raise InvalidEvent("wrong_type", f"{where} must be a map")
        return {key(k, where): val(v, f"{where}.{k}") for k, v in value.items()}

    return decode


def _enum(cls: type[Enum]) -> Decoder:
    def decode(value: Any, where: str) -> Enum:
        try:
            return cls(value)
        except ValueError as exc:
            raise InvalidEvent("unknown_field", f"{where}: {value!r} is not a known {cls.__name__}") from exc

    return decode


def _float(value: Any, where: str) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise InvalidEvent("wrong_type", f"{where} must be float, got {type(value).__name__}")


def _exactly(hint: Any) -> Decoder:
    name = getattr(hint, "__name__", hint)

    def decode(value: Any, where: str) -> Any:
        if type(value) is hint:
            return value
        raise InvalidEvent("wrong_type", f"{where} must be {name}, got {type(value).__name__}")

    return decode


def _dataclass(cls: type) -> Decoder:
    """A map of the dataclass's fields: unknown keys ignored (a newer sender may add fields), missing required ones
    and values of the wrong type refused."""
    hints = typing.get_type_hints(cls)
    plan = [
        (f.name, f".{f.name}", f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    ]
    # the fields' decoders are resolved on first use, so a dataclass may hold its own type; two threads racing
    # there each append a whole list, and the first is used
    resolved: list[list[tuple[str, str, bool, Decoder]]] = []

    def decode(value: Any, where: str) -> Any:
        if not resolved:
            resolved.append([(name, suffix, required, _decoder(hints[name])) for name, suffix, required in plan])
        if type(value) is not dict:
            raise InvalidEvent("wrong_type", f"{where} must be a map")
        kwargs = {}
        for name, suffix, required, field_decoder in resolved[0]:
            if name in value:
                kwargs[name] = field_decoder(value[name], where + suffix)
            elif required:
                raise InvalidEvent("wrong_type", f"{where}{suffix} is missing")
        return cls(**kwargs)

    return decode


def record(cls: type[R], value: Any, where: str) -> R:
    return cast(R, _decoder(cls)(value, where))


def encode_record(record: Any) -> bytes:
    """A dataclass record (context, topology, finding, ground truth...) as one MessagePack message."""
    out: bytes = msgpack.packb(
        {"v": SCHEMA_VERSION, "type": type(record).__name__, "d": to_wire(record)}, use_bin_type=True
    )
    return out


def decode_record(cls: type[R], payload: bytes) -> R:
    """Decode a record of type ``cls``; raises DecodeError (with a reason) when it is not one.

    Unknown keys are ignored (a newer sender may add fields); missing required ones and wrong types are errors.
    """
    obj = unpack(payload, identity=False)
    if obj.get("type") != cls.__name__:
        raise DecodeError("wrong_type", f"expected a {cls.__name__} record, got {obj.get('type')!r}")
    try:
        return record(cls, obj.get("d"), cls.__name__)
    except InvalidEvent as exc:
        raise DecodeError(exc.reason, exc.detail) from exc
    except (TypeError, ValueError) as exc:  # a record's own checks (__post_init__) refusing the values
        raise DecodeError("wrong_type", f"{cls.__name__}: {exc}"[:200]) from exc
