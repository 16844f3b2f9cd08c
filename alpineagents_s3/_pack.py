"""Packing: which entry objects and segments a save combines into one segment. Pure; no I/O.

The rule (docs/protocol.md, "Packing"), applied by every save to the parts its head will name:
the entry objects after the last segment are taken 16 at a time, oldest first, into a segment of
16 entries; whenever the last 4 parts are segments of the same number of entries, they become one
segment of 4 times as many, unless it would pass :data:`SEGMENT_MAX`. Only the segments left at
the end are written (one, usually). An entry object larger than :data:`LARGE` is left as it is
(it is large already); the entry objects after it are taken as before.

So a head names at most 3 segments of each size, the segments too large to merge, the large
entries and at most 15 entry objects: a history of n entries is O(log n) objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from alpineagents_s3._head import Part

__all__ = ["FOLD", "LARGE", "MERGE", "SEGMENT_MAX", "Plan", "plan"]

FOLD: Final = 16
MERGE: Final = 4
SEGMENT_MAX: Final = 8 * 1024 * 1024
# So FOLD entries no larger always fit in one segment, with its brackets and commas.
LARGE: Final = (SEGMENT_MAX - FOLD - 1) // FOLD


@dataclass(frozen=True)
class Plan:
    """What a save that packs writes and names.

    Attributes:
        parts: The parts the new head names, in seq order.
        segments: The new segments, each with the parts (as named before) whose bytes it
            joins, in seq order.
        replaced: The parts named before (or written by this save) that ``parts`` no longer
            names: deleted once the head is committed.
    """

    parts: tuple[Part, ...]
    segments: tuple[tuple[Part, tuple[Part, ...]], ...]
    replaced: tuple[Part, ...]


@dataclass(frozen=True)
class _Node:
    part: Part
    sources: tuple[Part, ...]  # the original parts it joins (itself, if it is one)
    size: int


def plan(parts: Sequence[Part], wid: str) -> Plan | None:
    """The packing of ``parts`` by the save ``wid``, or ``None`` when nothing is packed.

    Each part's size is in it (the head records them): no body is read to plan.
    """
    start = len(parts)
    while start > 0 and parts[start - 1].kind == "e":
        start -= 1
    if len(parts) - start < FOLD:
        return None
    stack = [_Node(part, (part,), part.size) for part in parts[:start]]
    run = [_Node(part, (part,), part.size) for part in parts[start:]]
    made = False
    while True:
        large = next((i for i, node in enumerate(run[:FOLD]) if node.size > LARGE), None)
        if large is not None:  # left as it is; the run goes on after it
            stack.extend(run[: large + 1])
            run = run[large + 1 :]
            continue
        if len(run) < FOLD:
            break
        stack.append(_joined(run[:FOLD], wid))
        run = run[FOLD:]
        made = True
        while len(stack) >= MERGE and _mergeable(stack[-MERGE:]):
            stack[-MERGE:] = [_joined(stack[-MERGE:], wid)]
    if not made:
        return None
    final = stack + run
    before = set(parts)
    named = {node.part for node in final}
    return Plan(
        parts=tuple(node.part for node in final),
        segments=tuple((node.part, node.sources) for node in final if node.part not in before),
        replaced=tuple(part for part in parts if part not in named),
    )


def _mergeable(nodes: Sequence[_Node]) -> bool:
    count = nodes[0].part.count
    return (
        all(node.part.kind == "s" and node.part.count == count for node in nodes)
        and sum(node.size for node in nodes) <= SEGMENT_MAX
    )


def _joined(nodes: Sequence[_Node], wid: str) -> _Node:
    """The segment of ``nodes``: its size is that of ``_codec.join`` of their bodies."""
    sources = tuple(source for node in nodes for source in node.sources)
    inner = sum(node.size - (2 if node.part.kind == "s" else 0) for node in nodes)
    size = inner + len(nodes) + 1  # the brackets, and a comma between two
    part = Part(nodes[0].part.first, nodes[-1].part.last, wid, "s", size)
    return _Node(part, sources, size)
