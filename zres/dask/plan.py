"""A Dask graph as zres tasks: one per task of the optimised graph, dependencies first.

Aliases (a key that only names another) become no task: their readers read the target.
Constants (``DataNode``) become tasks that return their value, so a large one is sent
once and read by its dependents where they run. The order is Dask's own (``dask.order``:
depth first, to free memory early) wherever dependencies allow: zres starts ready tasks
of equal priority in submission order.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .annotations import GraphAnnotations, Options, parts

_NAME_CHARS = 200  # a task's name in status and errors: its key, cut to this


@dataclass(slots=True)
class Step:
    """One zres task: NODE computed from its inputs' values."""

    key: Any                     # the node's key in the graph
    node: Any                    # a dask GraphNode: called with {input key: value}
    inputs: tuple[Any, ...]      # the keys NODE reads, as it names them
    sources: tuple[Any, ...]     # the step each input's value comes from (aliases followed)
    options: Options
    name: str = ""


@dataclass(slots=True)
class Plan:
    """The steps of a compute, dependencies first, and what was asked of it."""

    steps: list[Step]
    graph: dict[Any, Any]        # the optimised low-level graph (for Dask's callbacks)
    outputs: dict[Any, Any]      # each requested key -> the step that computes it
    readers: dict[Any, int] = field(default_factory=dict)  # step key -> steps reading it


def flatten(keys: Any) -> Iterator[Any]:
    """The keys in KEYS, nested in lists as Dask's schedulers take them (a tuple is a key)."""
    if isinstance(keys, list):
        for item in keys:
            yield from flatten(item)
    else:
        yield keys


def pack(keys: Any, values: dict[Any, Any]) -> Any:
    """VALUES in the nesting of KEYS, as a Dask scheduler returns them."""
    if isinstance(keys, list):
        return [pack(item, values) for item in keys]
    return values[keys]


def low_level(dsk: Any) -> dict[Any, Any]:
    """The optimised graph of DSK (an expression, a HighLevelGraph or a dict) as
    {key: GraphNode}, old-style tuples converted."""
    from dask._task_spec import GraphNode, convert_legacy_graph

    graph = dsk.__dask_graph__() if hasattr(dsk, "__dask_graph__") else dsk
    if not isinstance(graph, dict):
        graph = dict(graph)
    if all(isinstance(node, GraphNode) for node in graph.values()):
        return graph
    return convert_legacy_graph(graph)


def make_plan(dsk: Any, keys: Any, general: Options) -> Plan:
    """Plan the compute of KEYS from DSK; GENERAL applies to every task under its own
    annotations."""
    from dask._task_spec import Alias
    from dask.order import order

    annotations = GraphAnnotations.read(dsk)
    graph = low_level(dsk)

    def source(key: Any) -> Any:
        seen: list[Any] = []
        while isinstance(graph.get(key), Alias):
            if key in seen:
                raise ValueError(f"the graph's aliases go round in a circle: {seen!r}")
            seen.append(key)
            key = graph[key].target
        if key not in graph:
            where = f" (named by {seen[0]!r})" if seen else ""
            raise KeyError(f"{key!r} is not in the graph{where}")
        return key

    outputs = {key: source(key) for key in flatten(keys)}
    needed: dict[Any, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    work = list(set(outputs.values()))
    while work:
        key = work.pop()
        if key in needed:
            continue
        inputs = tuple(graph[key].dependencies)
        sources = tuple(source(k) for k in inputs)
        needed[key] = (inputs, sources)
        work.extend(s for s in sources if s not in needed)

    rank = order(graph) if len(needed) > 1 else {}
    steps = []
    readers: dict[Any, int] = dict.fromkeys(needed, 0)
    for key in _dependencies_first(needed, rank):
        inputs, sources = needed[key]
        for each in set(sources):
            readers[each] += 1
        node = graph[key]
        steps.append(Step(key, node, inputs, sources, annotations.of(node).over(general),
                          str(key)[:_NAME_CHARS]))
    return Plan(steps, graph, outputs, readers)


def _dependencies_first(needed: dict[Any, tuple[tuple[Any, ...], tuple[Any, ...]]],
                        rank: dict[Any, Any]) -> list[Any]:
    """The keys of NEEDED, each after its sources, otherwise in RANK's order (Kahn's
    algorithm, the ready key of lowest rank first)."""
    waiting = {key: len(set(sources)) for key, (_, sources) in needed.items()}
    readers: dict[Any, list[Any]] = {}
    for key, (_, sources) in needed.items():
        for each in set(sources):
            readers.setdefault(each, []).append(key)
    number = {key: i for i, key in enumerate(needed)}  # keys of mixed types never compare

    def place(key: Any) -> tuple[Any, int]:
        found = rank.get(key)
        return (getattr(found, "priority", found) if found is not None else 0, number[key])

    ready = [(*place(k), k) for k, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    done = []
    while ready:
        *_, key = heapq.heappop(ready)
        done.append(key)
        for reader in readers.get(key, ()):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (*place(reader), reader))
    if len(done) != len(needed):
        raise ValueError("the graph has a cycle: "
                         f"{[k for k, count in waiting.items() if count][:5]!r} wait on "
                         "each other")
    return done


def run_node(pickled: bytes, inputs: tuple[Any, ...], *values: Any) -> Any:
    """Compute the PICKLED node (on a worker) from the VALUES of its INPUTS; an error
    names its key and, for a fused task, the tasks it was made of."""
    try:
        node = pickle.loads(pickled)
    except ModuleNotFoundError as exc:
        exc.add_note("(a Dask task: the agents need Dask installed too: pip install "
                     "'zres[dask]')")
        raise
    try:
        return node(dict(zip(inputs, values)))
    except Exception as exc:
        made = [str(key) for key, _ in parts(node, ())][1:]
        made_of = f"; fused from {', '.join(made[:6])}" if made else ""
        more = f" and {len(made) - 6} more" if len(made) > 6 else ""
        exc.add_note(f"(in the Dask task {node.key!r}, run by zres{made_of}{more})")
        raise
