"""Planning a Dask graph as zres tasks, with no cluster: annotations read before Dask
optimises the graph and carried onto what it fuses, by the union rule; dependencies
first; bad annotations refused naming the task."""

from __future__ import annotations

import re

import dask
import dask.array as da
import dask.bag as db
import pytest
from dask._expr import FinalizeCompute
from dask.base import collections_to_expr

from zres.dask.annotations import Options, options, parts
from zres.dask.plan import make_plan

pytestmark = pytest.mark.timeout(60)


def optimised(*collections):
    """What dask.compute hands a scheduler: the optimised expression and its keys."""
    expr = FinalizeCompute(collections_to_expr(list(collections))).optimize()
    return expr, expr.__dask_keys__()


def inc(block):
    return block + 1


def made_of_inc(node) -> bool:
    return any("inc" in str(key) for key, _ in parts(node, ()))


def test_fused_tasks_keep_the_annotations_of_their_parts():
    x = da.ones((20, 20), chunks=(10, 10))
    with dask.annotate(resources={"GPU": 1}, priority=3):
        y = x.map_blocks(inc)
    expr, keys = optimised(y.map_blocks(inc).sum())
    plan = make_plan(expr, keys, Options())
    with_inc = [s for s in plan.steps if made_of_inc(s.node)]
    assert len(with_inc) == 4, "each block's chain of tasks is fused into one"
    assert {s.options for s in with_inc} == {Options((("GPU", 1),), 3, None)}
    others = [s for s in plan.steps if s not in with_inc]
    assert others and all(s.options == Options() for s in others)


def test_steps_come_after_their_sources_and_aliases_are_followed():
    graph = {"a": 1, "b": (inc, "a"), "c": "b", "d": (sum, ["b", "c"])}
    plan = make_plan(graph, ["d", "c"], Options())
    order = [s.key for s in plan.steps]
    assert order == ["a", "b", "d"]
    assert plan.outputs == {"d": "d", "c": "b"}
    assert plan.readers == {"a": 1, "b": 1, "d": 0}
    assert [s.sources for s in plan.steps if s.key == "d"] == [("b", "b")]


def test_the_union_rule():
    gpu = Options((("GPU", 1), ("MEMORY", 2e9)), 1, 0)
    part = Options((("GPU", 0.5), ("licence", 1)), 5, None)
    assert gpu.union(part) == Options((("GPU", 1), ("MEMORY", 2e9), ("licence", 1)), 5, 0)
    assert Options().union(part) == part


def test_a_task_s_own_annotations_win_over_the_compute_s_resource_by_resource():
    general = Options((("CPU", 2), ("GPU", 1)), 1, 2)
    own = Options((("GPU", 0.25),), None, 0)
    assert own.over(general) == Options((("CPU", 2), ("GPU", 0.25)), 1, 0)


def test_callable_annotations_are_asked_per_block():
    x = da.ones((4,), chunks=1)
    with dask.annotate(priority=lambda key: key[1] * 10):
        y = x.map_blocks(inc)
    expr, keys = optimised(y)
    plan = make_plan(expr, keys, Options())
    assert sorted(s.options.priority for s in plan.steps if made_of_inc(s.node)) == \
        [0, 10, 20, 30]


@pytest.mark.parametrize("bad, message", [
    ({"priority": 1.5}, "priority annotation must be a whole number, got 1.5"),
    ({"retries": "2"}, "retries annotation must be a whole number"),
    ({"resources": {"GPU": "one"}}, "resources annotation 'GPU': 'one' is not an amount"),
    ({"resources": ["GPU"]}, "must be a mapping"),
])
def test_bad_annotations_are_refused_naming_the_task(bad, message):
    with pytest.raises((TypeError, ValueError), match=message):
        options(bad, "Dask task 'x'")


def test_a_bad_annotation_in_a_graph_names_its_task():
    with dask.annotate(priority=1.5):  # (Dask takes any number)
        annotated = dask.delayed(inc)(dask.delayed(inc)(1))
    expr, keys = optimised(annotated)
    with pytest.raises(ValueError, match="Dask task .*inc-.*whole number, got 1.5"):
        make_plan(expr, keys, Options())


def test_a_cycle_and_a_missing_key_are_refused():
    with pytest.raises((ValueError, RuntimeError), match="[Cc]ycle"):
        make_plan({"a": (inc, "b"), "b": (inc, "a")}, "a", Options())
    with pytest.raises(KeyError, match="'z' is not in the graph"):
        make_plan({"a": 1}, "z", Options())


def test_other_annotations_are_said_to_be_ignored():
    with dask.annotate(workers=["w1"]):
        annotated = dask.delayed(inc)(1)
    expr, keys = optimised(annotated)
    with pytest.warns(UserWarning, match="ignores workers"):
        make_plan(expr, keys, Options())


def dec(block):
    return block - 1


def gpu_of(plan, name: str) -> set[float]:
    """The GPU asked for by the steps made of a task named NAME (0: none). (NAME is a
    whole word of the key: a random token in another's key may hold it, as "dec" is hex.)"""
    return {dict(s.options.resources).get("GPU", 0) for s in plan.steps
            if any(name in re.split(r"[^0-9a-zA-Z_]+", str(key))
                   for key, _ in parts(s.node, ()))}


def test_annotated_and_plain_tasks_in_one_graph_each_keep_their_own():
    """Dask gives the unannotated tasks of a merged layer a tombstone for their annotation:
    it means none (it used to fail the whole compute with a TypeError naming it)."""
    with dask.annotate(resources={"GPU": 1}, priority=2):
        annotated = [dask.delayed(inc)(i) for i in range(3)]
        array = da.ones((4,), chunks=2).map_blocks(inc)
    plain = [dask.delayed(dec)(i) for i in range(3)]
    bag = db.from_sequence(range(4), npartitions=2).map(dec)
    expr, keys = optimised(dask.delayed(sum)(annotated + plain), array.sum(), bag.sum())
    plan = make_plan(expr, keys, Options())
    assert gpu_of(plan, "inc") == {1}
    assert gpu_of(plan, "dec") == {0}
    assert {s.options.priority for s in plan.steps if made_of_inc(s.node)} == {2}
