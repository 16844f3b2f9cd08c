"""The mutation run: each guard of the protocol removed in turn, the checker must fail.

A mutant is the plugin's own source with one guard taken out (a condition, a check, an order),
compiled into its module for the test's duration. For each, random schedules are explored until
one breaks an invariant; a mutant the checker cannot tell from the real protocol fails the test
(either the guard keeps no promise, or the checker misses a promise). Run with ``-s`` to see
each mutant's first violation.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Iterator
from types import ModuleType

import pytest

from alpineagents_s3 import _delete, _engine, _head, _list, _load, _memory, _pack, _save, _sweep
from tests.protocol.world import InvariantError, explore, run_scenarios

BUDGET = int(os.environ.get("ALPINEAGENTS_MUTANT_SCHEDULES", "4000"))

# (name, module, the guard as it stands in the source, what the mutant has instead, world)
MUTANTS: list[tuple[str, ModuleType, str, str, dict[str, bool]]] = [
    (
        "a tombstone head read as a State (invariant 1)",
        _load,
        "if head.deleted:  # the base",
        "if False:  # the base",
        {},
    ),
    (
        "a small head not padded: listed as a tombstone (invariant 13)",
        _head,
        "if not self.deleted and len(body) < SMALLEST_HEAD:",
        "if False:",
        {},
    ),
    (
        "a listing that takes a head it holds without the LIST's ETag (invariant 8)",
        _list,
        "elif etag is not None and seen.head is not None and seen.etag == etag:",
        "elif seen.head is not None:",
        {},
    ),
    (
        "a listing that takes the last list's summary without the LIST's ETag (invariant 8)",
        _list,
        "if etag is not None and state_id in last and last[state_id][0] == etag:",
        "if state_id in last:",
        {},
    ),
    (
        "a listing that passes over heads of States too (invariants 10, 13)",
        _list,
        "size < SMALLEST_HEAD:",
        "size < 4 * SMALLEST_HEAD:",
        {},
    ),
    (
        "head PUT without If-Match (invariant 4)",
        _save,
        "if_match=etag if prior is not None else None)",
        "create=prior is None, if_match=None)",
        {},
    ),
    (
        "create without If-None-Match (invariant 4)",
        _save,
        "if_match=etag if prior is not None else None)",
        "if_match=etag if prior is not None else None, create=False)",
        {},
    ),
    (
        "any head after a 412 taken for its own (invariant 5)",
        _save,
        "if stored is not None and stored.write == wid:",
        "if stored is not None:",
        {},
    ),
    (
        "its own head after a 412 not recognised (invariant 5)",
        _save,
        "if stored is not None and stored.write == wid:",
        "if False:",
        {},
    ),
    (
        "an unsure head PUT not remembered (invariant 5)",
        _save,
        "    memory.unsure(ctx.scope, state_id, wid)\n",
        "",
        {},
    ),
    (
        "the base moved to another writer's head after a refusal (invariant 4)",
        _save,
        "            raise _conflict(ctx, state_id, why)",
        "            memory.read(ctx.scope, state_id, stored, got[1], sent)  # type: ignore\n"
        "            raise _conflict(ctx, state_id, why)",
        {},
    ),
    (
        "the parts of a save that may have landed deleted (invariant 7)",
        _save,
        "            lost = stored.after == replaced or stored.inc != head.inc",
        "            lost = True",
        {},
    ),
    (
        "entries sent again not compared (invariant 6)",
        _save,
        "if not _same(by_seq[entry.seq], entry.body):",
        "if False:",
        {},
    ),
    (
        "a save continuing past the stored count (invariant 6)",
        _save,
        "if fresh and fresh[0].seq != count:",
        "if False:",
        {},
    ),
    (
        "a failed entry PUT ignored: the head names a missing part (invariant 3)",
        _save,
        'fail(layout, outcome, "PutObject", k, "If-None-Match: *")',
        "pass",
        {},
    ),
    (
        "parts packed away deleted before the head is committed (invariant 7)",
        _save,
        "    # Batch 2: the head, conditional on the base (invariant 4).",
        "    if packing is not None:\n"
        "        yield from _drop(ctx, state_id, head.inc, packing.replaced)\n"
        "    # Batch 2: the head, conditional on the base (invariant 4).",
        {},
    ),
    (
        "a load that finds a part gone does not read the head again (invariant 8)",
        _load,
        "            last = (etag, e.key)\n            continue",
        "            raise CorruptStateError(e.key)",
        {},
    ),
    (
        "a load's older head replaces the base (invariant 4)",
        _memory,
        "if known is None or later or sent > seen.at:",
        "if True:",
        {},
    ),
    (
        "sweep without the store's mark (invariant 9)",
        _sweep,
        "    ours, _ = yield from marked(ctx, candidates, set())",
        "    ours = candidates",
        {},
    ),
    (
        "sweep without the age guard (invariant 9)",
        _sweep,
        "def _older(obj: dict[str, Any], cutoff: datetime) -> bool:\n",
        "def _older(obj: dict[str, Any], cutoff: datetime) -> bool:\n    return True\n",
        {},
    ),
    (
        "delete without the store's mark (invariant 9)",
        _delete,
        "    ours, kept = yield from marked(ctx, dead, named)",
        "    ours, kept = dead, []",
        {},
    ),
    (
        "delete of every incarnation of the id, a create's under way too (invariant 9)",
        _delete,
        "    folder = layout.inc_folder(state_id, tombstone.inc)",
        "    folder = layout.state_folder(state_id)",
        {},
    ),
    (
        "delete's tombstone PUT without If-Match (invariant 4)",
        _delete,
        'put = layout.put(key, tombstone.encode(), "tombstone", if_match=etag)',
        'put = layout.put(key, tombstone.encode(), "tombstone", create=False)',
        {},
    ),
    (
        "delete that deletes the head object after its tombstone (invariant 12)",
        _delete,
        "(outcome,) = yield from send([put], layout.root)",
        "(outcome, _) = yield from send([put, layout.delete(key)], layout.root)",
        {},
    ),
    (
        "a save on a tombstone base (invariant 12)",
        _save,
        "        if base.deleted:  # invariant 12: never a head on a deleted incarnation\n"
        "            raise _not_found(ctx, state_id)\n",
        "",
        {},
    ),
    (
        "delete without the engine check (invariant 11)",
        _delete,
        "    yield from ensure(ctx)  # invariant 11: the If-Match below must mean something\n",
        "",
        {"lying": True},
    ),
    (
        "purge without the store's mark (invariant 9)",
        _delete,
        "        if _is_marked(outcome):\n            data.append((key, version))",
        "        data.append((key, version))",
        {"versioned": True},
    ),
    (
        "purge of the current objects of a State made again (invariant 9)",
        _delete,
        "if key in kept or marker or (latest and alive):",
        "if key in kept or marker:",
        {"versioned": True},
    ),
    (
        "the engine not checked (invariant 11)",
        _save,
        "probe = None if ctx.engine_checked else Probe(layout)",
        "probe = None",
        {"lying": True},
    ),
    (
        "an engine's acceptance of a second create not taken as a failure (invariant 11)",
        _engine,
        '                self.problems.append(f"it accepted {what}")',
        "                pass",
        {"lying": True},
    ),
]


@pytest.fixture(autouse=True)
def small_packing_quietly(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_pack, "FOLD", 3)
    monkeypatch.setattr(_pack, "MERGE", 2)
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def mutate(monkeypatch: pytest.MonkeyPatch, module: ModuleType, guard: str, mutant: str) -> None:
    """Compile ``module``'s source with ``guard`` replaced by ``mutant`` into the module.

    Functions are replaced in the module (and where other protocol modules imported them);
    a class keeps its identity and gets the mutant's methods, so objects made elsewhere use them.
    """
    source = inspect.getsource(module)
    assert source.count(guard) == 1, f"the guard is not (once) in {module.__name__}: {guard!r}"
    namespace = dict(vars(module))
    exec(compile(source.replace(guard, mutant), module.__file__ or "", "exec"), namespace)
    for name, value in list(namespace.items()):
        original = vars(module).get(name)
        if isinstance(value, type) and isinstance(original, type) and value is not original:
            for attr, member in vars(value).items():
                before = vars(original).get(attr)
                if inspect.isfunction(member) and inspect.isfunction(before):
                    if _code(member) != _code(before):  # only the methods the mutant changed
                        monkeypatch.setattr(original, attr, member)
            namespace[name] = original  # the mutant's functions see the class that is in use
    for name, value in namespace.items():
        if inspect.isfunction(value) and value.__module__ == module.__name__:
            monkeypatch.setattr(module, name, value)
            for other in (_save, _load, _delete, _sweep, _engine):
                if vars(other).get(name) is vars(module).get(name) and other is not module:
                    monkeypatch.setattr(other, name, value)


def _code(function: object) -> tuple[object, ...]:
    code = function.__code__  # type: ignore[attr-defined]
    return code.co_code, code.co_consts, code.co_names


def test_the_real_protocol_passes_the_same_schedules() -> None:
    found = explore(range(BUDGET // 4))
    assert found is None, f"seed {found[0]}: {found[1]}" if found else ""
    failed = run_scenarios()
    assert failed is None, failed


@pytest.mark.parametrize(
    ("name", "module", "guard", "mutant", "world"), MUTANTS, ids=[m[0] for m in MUTANTS]
)
def test_the_checker_kills_the_mutant(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    module: ModuleType,
    guard: str,
    mutant: str,
    world: dict[str, bool],
) -> None:
    mutate(monkeypatch, module, guard, mutant)
    failed = run_scenarios()
    if failed is not None and isinstance(failed[1], InvariantError):
        print(f"\n{name}: killed by {failed[0]}: {str(failed[1]).splitlines()[0][:160]}")
        return
    # A scenario that went another way than it describes (its own set-up assertion) is no
    # kill: only a broken invariant is.
    found = explore(range(BUDGET), **world)
    assert found is not None, f"the checker did not notice: {name}, in {BUDGET} schedules"
    seed, violation, _ = found
    print(f"\n{name}: killed by schedule {seed}: {str(violation).splitlines()[0][:160]}")
