"""JSON values of untrusted depth: measure, encode and copy them without recursion.

A model can write an action whose JSON nests hundreds of levels deep.  Python's decoder accepts
it up to its recursion limit, but ``copy.deepcopy`` and ``pickle`` of such a value raise
``RecursionError`` from about 500 levels, and ``json.dumps`` from wherever the caller's stack
already is.  Everything here walks with an explicit stack, so its cost depends on the size of the
value and never on the interpreter's recursion limit (docs/protocol.md#differences-and-parity-switches).
"""

from __future__ import annotations

import json
from typing import Any

#: containers nested deeper than this inside a stored action are kept as their JSON text, so a
#: record can be copied, pickled (Ray) and written whatever the caller's stack depth
STORED_ACTION_NESTING = 100


def nesting_depth(value: Any) -> int:
    """Levels of list/dict nesting (a scalar is 0, ``[]`` and ``{}`` are 1)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


class _Close(str):
    """A closing bracket waiting on the encoder's stack."""


def json_text(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)`` for lists, dicts and JSON scalars, at any depth."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Close):
            out.append(item)
        elif isinstance(item, (dict, list)):
            entries = list(item.items()) if isinstance(item, dict) else list(enumerate(item))
            out.append("{" if isinstance(item, dict) else "[")
            stack.append(_Close("}" if isinstance(item, dict) else "]"))
            for index in range(len(entries) - 1, -1, -1):
                key, child = entries[index]
                stack.append(child)
                prefix = ", " if index else ""
                if isinstance(item, dict):
                    prefix += json.dumps(_key(key), ensure_ascii=False) + ": "
                stack.append(_Close(prefix))
        else:
            out.append(json.dumps(item, ensure_ascii=False))
    return "".join(out)


def _key(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it (decoded JSON has only string keys)."""
    return key if isinstance(key, str) else json.dumps(key)


def bounded_copy(value: Any, max_depth: int = STORED_ACTION_NESTING) -> Any:
    """A copy of lists and dicts down to ``max_depth`` levels; a container below that becomes
    its :func:`json_text`, so the copy itself nests at most ``max_depth`` levels."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    while stack:
        item, parent, slot, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            parent[slot] = item
        elif depth > max_depth:
            parent[slot] = json_text(item)
        elif isinstance(item, dict):
            mapping: dict[Any, Any] = dict.fromkeys(item)
            parent[slot] = mapping
            stack.extend((child, mapping, key, depth + 1) for key, child in item.items())
        else:
            seq: list[Any] = [None] * len(item)
            parent[slot] = seq
            stack.extend((child, seq, i, depth + 1) for i, child in enumerate(item))
    return root[0]
