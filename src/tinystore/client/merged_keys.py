"""Dict keys that a type's decoding makes one: a channel typed ``dict[datetime, int]`` reads the keys
``datetime(2024, 1, 1, tzinfo=UTC)`` and ``"2024-01-01T01:00:00+01:00"`` as one datetime, and its typed listeners
get one entry of the two, the other lost without a word (trial GA). Such keys are found by reading a value twice,
as the type reads it and as plain MessagePack, and comparing the sizes of the dicts the type makes from maps.

Only types with a dict whose keys are not text (nor any JSON value) can merge keys: :func:`merging_type` says
whether one does, once per channel, so that other channels pay nothing.
"""

from __future__ import annotations

from typing import Any

from msgspec import inspect

_KEEPS_KEYS = (inspect.StrType, inspect.AnyType)
"""Key types whose decoding keeps every key a map has (text stays text; any value stays what it was)."""


def merging_type(type_: Any) -> inspect.Type | None:
    """The type information of ``type_`` when somewhere in it a dict's keys are read as a type other than text (a
    datetime, an int, a UUID, an Enum...), whose reading may make two keys one; else None."""
    info = inspect.type_info(type_)
    seen: set[int] = set()
    stack: list[inspect.Type] = [info]
    while stack:
        t = _bare(stack.pop())
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, inspect.DictType):
            if not isinstance(_bare(t.key_type), _KEEPS_KEYS):
                return info
            stack.append(t.value_type)
        elif isinstance(t, inspect.ListType | inspect.VarTupleType | inspect.SetType | inspect.FrozenSetType):
            stack.append(t.item_type)
        elif isinstance(t, inspect.TupleType):
            stack.extend(t.item_types)
        elif isinstance(t, inspect.StructType | inspect.DataclassType | inspect.TypedDictType | inspect.NamedTupleType):
            stack.extend(f.type for f in t.fields)
        elif isinstance(t, inspect.UnionType):
            stack.extend(t.types)
    return None


def merged_key(info: inspect.Type, typed: Any, plain: Any) -> str | None:
    """Where ``typed`` (a value as ``info``'s type reads it) holds a dict of fewer entries than the map ``plain``
    (the same value read as plain MessagePack) has there: its path (``$``, ``$.field``, ``$[0]``), else None. Parts
    whose shape cannot be followed (a union of several types, a struct written as an array) are not looked into."""
    stack: list[tuple[inspect.Type, Any, Any, str]] = [(info, typed, plain, "$")]
    while stack:
        t, tv, pv, path = stack.pop()
        t = _bare(t)
        if isinstance(t, inspect.DictType):
            if not (isinstance(tv, dict) and isinstance(pv, dict)):
                continue
            if len(tv) < len(pv):
                return path
            # (no two made one here: the entries are in the same order)
            for (key, item), raw in zip(tv.items(), pv.values(), strict=True):
                stack.append((t.value_type, item, raw, f"{path}[{key!r}]"))
        elif isinstance(t, inspect.ListType | inspect.VarTupleType):
            if isinstance(tv, list | tuple) and isinstance(pv, list):
                stack.extend((t.item_type, a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(tv, pv, strict=False)))
        elif isinstance(t, inspect.TupleType):
            if isinstance(tv, tuple) and isinstance(pv, list):
                stack.extend(
                    (it, a, b, f"{path}[{i}]") for i, (it, a, b) in enumerate(zip(t.item_types, tv, pv, strict=False))
                )
        elif isinstance(t, inspect.StructType | inspect.DataclassType):
            if isinstance(pv, dict):
                for f in t.fields:
                    if f.encode_name in pv and hasattr(tv, f.name):
                        stack.append((f.type, getattr(tv, f.name), pv[f.encode_name], f"{path}.{f.name}"))
        elif isinstance(t, inspect.TypedDictType):
            if isinstance(tv, dict) and isinstance(pv, dict):
                for f in t.fields:
                    if f.encode_name in pv and f.name in tv:
                        stack.append((f.type, tv[f.name], pv[f.encode_name], f"{path}.{f.name}"))
        elif isinstance(t, inspect.UnionType):
            others = [u for u in t.types if not isinstance(_bare(u), inspect.NoneType)]
            if len(others) == 1 and tv is not None:
                stack.append((others[0], tv, pv, path))
    return None


def _bare(t: inspect.Type) -> inspect.Type:
    """``t`` without its ``Annotated`` constraints."""
    while isinstance(t, inspect.Metadata):
        t = t.type
    return t
