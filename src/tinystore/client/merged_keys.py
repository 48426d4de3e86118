"""Dict keys that a type's decoding makes one: a channel typed ``dict[datetime, int]`` reads the keys
``datetime(2024, 1, 1, tzinfo=UTC)`` and ``"2024-01-01T01:00:00+01:00"`` as one datetime, and its typed listeners
get one entry of the two, the other lost without a word (trial GA). Such keys are found by reading a value twice,
as the type reads it and as plain MessagePack, and comparing the sizes of the dicts the type makes from maps.

Only types with a dict whose keys are not text (nor any JSON value) can merge keys: :func:`merging_type` says
whether one does, once per channel, so that other channels pay nothing; and only the parts of a value whose type
holds such a dict are looked into (trial GE: a walk of every leaf made a publish of 60 KiB 17 times slower).
"""

from __future__ import annotations

import typing
from typing import Any

from msgspec import inspect

_KEEPS_KEYS = (inspect.StrType, inspect.AnyType)
"""Key types whose decoding keeps every key a map has (text stays text; any value stays what it was)."""
_FIELDED = (inspect.StructType, inspect.DataclassType, inspect.TypedDictType, inspect.NamedTupleType)
_SETS = (inspect.SetType, inspect.FrozenSetType)
_SEQUENCES = (inspect.ListType, inspect.VarTupleType, *_SETS)


class Merging:
    """A channel type's information, and which of its parts may hold a dict that merges keys."""

    __slots__ = ("info", "risky")

    def __init__(self, info: inspect.Type, risky: set[int]) -> None:
        self.info = info
        self.risky = risky  # ids of the type nodes (bare) under which such a dict may be


def merging_type(type_: Any) -> Merging | None:
    """How to look for merged keys in values of ``type_``, when somewhere in it a dict's keys are read as a type
    other than text (a datetime, an int, a UUID, an Enum...), whose reading may make two keys one; else None."""
    info = inspect.type_info(type_)
    children: dict[int, list[int]] = {}  # node id → its parts' ids (a recursive type refers back)
    merging: set[int] = set()
    todo = [_bare(info)]
    while todo:
        t = todo.pop()
        if id(t) in children:
            continue
        parts: list[inspect.Type] = []
        if isinstance(t, inspect.DictType):
            if not isinstance(_bare(t.key_type), _KEEPS_KEYS):
                merging.add(id(t))
            parts = [t.value_type]
        elif isinstance(t, _SEQUENCES):
            if isinstance(t, _SETS) and not isinstance(_bare(t.item_type), _KEEPS_KEYS):
                merging.add(id(t))  # (a set's items are one as keys are: trial GF)
            parts = [t.item_type]
        elif isinstance(t, inspect.TupleType):
            parts = list(t.item_types)
        elif isinstance(t, _FIELDED):
            parts = [f.type for f in t.fields]
        elif isinstance(t, inspect.UnionType):
            parts = list(t.types)
        bare = [_bare(p) for p in parts]
        children[id(t)] = [id(p) for p in bare]
        todo.extend(bare)
    if not merging:
        return None
    risky = set(merging)
    grew = True
    while grew:  # (what holds a risky part is risky: until nothing more is)
        grew = False
        for node, part_ids in children.items():
            if node not in risky and any(p in risky for p in part_ids):
                risky.add(node)
                grew = True
    return Merging(info, risky)


def merged_key(merging: Merging, typed: Any, plain: Any) -> str | None:
    """Where ``typed`` (a value as the type reads it) holds a dict of fewer entries than the map ``plain`` (the
    same value read as plain MessagePack) has there: its path (``$``, ``$.field``, ``$[0]``), else None. Parts whose
    shape cannot be followed (a struct made otherwise by its ``__post_init__``) are not looked into."""
    try:
        return _walk(merging, typed, plain)
    except Exception:  # (a value the type's own code reshaped: not looked into)
        return None


def _walk(merging: Merging, typed: Any, plain: Any) -> str | None:
    risky = merging.risky
    # (type, typed value, plain value, path: a parent path and a step, made text only when a merge is found)
    stack: list[tuple[inspect.Type, Any, Any, Any]] = [(merging.info, typed, plain, None)]
    while stack:
        t, tv, pv, path = stack.pop()
        t = _bare(t)
        if id(t) not in risky:
            continue
        if isinstance(t, inspect.UnionType):
            branch = _branch(t, tv)
            if branch is not None:
                stack.append((branch, tv, pv, path))
        elif isinstance(t, inspect.DictType):
            if not (isinstance(tv, dict) and isinstance(pv, dict)):
                continue
            if len(tv) < len(pv):
                return _path_text(path)
            if len(tv) == len(pv) and id(_bare(t.value_type)) in risky:
                # (no two made one here: the entries are in the same order)
                for (key, item), raw in zip(tv.items(), pv.values(), strict=True):
                    stack.append((t.value_type, item, raw, (path, f"[{key!r}]")))
        elif isinstance(t, _SETS):
            if isinstance(tv, set | frozenset) and isinstance(pv, list) and len(tv) < len(pv):
                return _path_text(path)
        elif isinstance(t, inspect.ListType | inspect.VarTupleType):
            if isinstance(tv, list | tuple) and isinstance(pv, list) and id(_bare(t.item_type)) in risky:
                pairs = enumerate(zip(tv, pv, strict=False))
                stack.extend((t.item_type, a, b, (path, f"[{i}]")) for i, (a, b) in pairs)
        elif isinstance(t, inspect.TupleType):
            if isinstance(tv, tuple) and isinstance(pv, list):
                stack.extend(
                    (it, a, b, (path, f"[{i}]"))
                    for i, (it, a, b) in enumerate(zip(t.item_types, tv, pv, strict=False))
                    if id(_bare(it)) in risky
                )
        elif isinstance(t, inspect.StructType | inspect.DataclassType | inspect.NamedTupleType):
            if hasattr(tv, "__post_init__"):
                continue  # (its own code may have reshaped its fields: not looked into; trial GF)
            fields = [f for f in t.fields if id(_bare(f.type)) in risky]
            if isinstance(pv, dict):
                for f in fields:
                    if f.encode_name in pv and hasattr(tv, f.name):
                        stack.append((f.type, getattr(tv, f.name), pv[f.encode_name], (path, f".{f.name}")))
            elif isinstance(pv, list):  # (an array_like Struct, a NamedTuple: its fields in order, after a tag)
                first = 1 if getattr(t, "tag", None) is not None else 0
                index = {f.name: first + i for i, f in enumerate(t.fields)}
                for f in fields:
                    i = index[f.name]
                    if i < len(pv) and hasattr(tv, f.name):
                        stack.append((f.type, getattr(tv, f.name), pv[i], (path, f".{f.name}")))
        elif isinstance(t, inspect.TypedDictType):
            if isinstance(tv, dict) and isinstance(pv, dict):
                for f in t.fields:
                    if id(_bare(f.type)) in risky and f.encode_name in pv and f.name in tv:
                        stack.append((f.type, tv[f.name], pv[f.encode_name], (path, f".{f.name}")))
    return None


def _branch(union: inspect.UnionType, value: Any) -> inspect.Type | None:
    """The type of ``union`` that ``value`` was read as, or None when it cannot be told (or it is None)."""
    if value is None:
        return None
    for u in union.types:
        b = _bare(u)
        if isinstance(b, _FIELDED) and not isinstance(b, inspect.TypedDictType):
            if type(value) is (typing.get_origin(b.cls) or b.cls):  # (a generic's class: Box of Box[T]; trial GF)
                return u
        elif isinstance(value, dict) and isinstance(b, inspect.DictType | inspect.TypedDictType):
            return u
        elif isinstance(value, list) and isinstance(b, inspect.ListType):
            return u
        elif isinstance(value, tuple) and isinstance(b, inspect.TupleType | inspect.VarTupleType):
            return u
        elif isinstance(value, set | frozenset) and isinstance(b, inspect.SetType | inspect.FrozenSetType):
            return u
    return None


def _path_text(path: Any) -> str:
    steps: list[str] = []
    while path is not None:
        path, step = path
        steps.append(step)
    return "$" + "".join(reversed(steps))


def _bare(t: inspect.Type) -> inspect.Type:
    """``t`` without its ``Annotated`` constraints."""
    while isinstance(t, inspect.Metadata):
        t = t.type
    return t
