"""Typed JSON bodies: dataclasses in, JSON out, and back, checked by their type hints.

Every request and response of the admin and REST APIs is a frozen
dataclass in `client_lib.api.admin` or `client_lib.api.rest`. Both ends
convert through this module, so a field is declared once and a body that
does not fit its declaration is refused with a message that names the
field, on the server before a handler runs and on the client before the
caller sees it.

Supported field types: ``int`` (not bool), ``float`` (ints accepted),
``str``, ``bool``, ``Block`` (CIDR text on the wire), ``X | None``,
``list[X]``, ``tuple[X, Y]`` (a JSON array of fixed length),
``dict[str, X]``, nested dataclasses, and ``object`` for free-form JSON.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin

from client_lib.cidr import Block

T = TypeVar("T")

Json = Any
"""A value `json.loads` may return."""


class CodecError(ValueError):
    """A body that does not match its declared type; the message names the field."""


def to_json(value: object) -> Json:
    """A dataclass (or any supported value) as JSON-ready data."""
    if isinstance(value, Block):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def dumps(value: object) -> bytes:
    return json.dumps(to_json(value), separators=(",", ":"), default=str).encode()


def loads(cls: type[T], raw: bytes, *, strict: bool = True) -> T:
    """Parse a body into `cls`. `strict` refuses fields `cls` does not declare
    (what a server does with requests); clients read responses leniently so
    that a newer server may add fields."""
    try:
        data = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"body is not JSON: {exc}") from None
    return from_json(cls, data, strict=strict)


def from_json(cls: type[T], data: Json, *, strict: bool = True, where: str = "body") -> T:
    return typing.cast(T, _convert(cls, data, strict, where))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(tp: Any, data: Json, strict: bool, where: str) -> Any:
    origin = get_origin(tp)
    if tp is object or tp is Any:
        return data
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if data is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, data, strict, where)
            except CodecError as exc:
                errors.append(str(exc))
        raise CodecError("; ".join(errors))
    if tp is Block:
        if not isinstance(data, str):
            raise CodecError(f"{where}: expected a CIDR string, got {_kind(data)}")
        try:
            return Block.parse(data)
        except ValueError as exc:
            raise CodecError(f"{where}: {exc}") from None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass(tp, data, strict, where)
    if tp is bool:
        if not isinstance(data, bool):
            raise CodecError(f"{where}: expected true or false, got {_kind(data)}")
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise CodecError(f"{where}: expected an integer, got {_kind(data)}")
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise CodecError(f"{where}: expected a number, got {_kind(data)}")
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            raise CodecError(f"{where}: expected a string, got {_kind(data)}")
        return data
    if origin is list:
        if not isinstance(data, list):
            raise CodecError(f"{where}: expected a list, got {_kind(data)}")
        (item,) = get_args(tp)
        return [_convert(item, v, strict, f"{where}[{i}]") for i, v in enumerate(data)]
    if origin is tuple:
        items = get_args(tp)
        if not isinstance(data, list) or len(data) != len(items):
            raise CodecError(f"{where}: expected a list of {len(items)} values, got {_kind(data)}")
        return tuple(_convert(t, v, strict, f"{where}[{i}]")
                     for i, (t, v) in enumerate(zip(items, data, strict=True)))
    if origin is dict:
        key_type, value_type = get_args(tp)
        if key_type is not str or not isinstance(data, dict):
            raise CodecError(f"{where}: expected an object, got {_kind(data)}")
        return {k: _convert(value_type, v, strict, f"{where}.{k}") for k, v in data.items()}
    raise TypeError(f"{where}: no JSON conversion for {tp!r}")


def _dataclass(cls: type, data: Json, strict: bool, where: str) -> Any:
    if not isinstance(data, dict):
        raise CodecError(f"{where}: expected an object, got {_kind(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if strict:
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise CodecError(f"{where}: unknown field(s) {', '.join(unknown)}")
    values = {}
    for name, field in fields.items():
        if name in data:
            inner = name if where == "body" else f"{where}.{name}"
            values[name] = _convert(hints[name], data[name], strict, inner)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise CodecError(f"{where}: missing field {name!r}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"{where}: {exc}") from None


def _kind(data: Json) -> str:
    if data is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(data), type(data).__name__)
