"""Dask annotations, read before Dask optimises a graph and carried onto the tasks it fuses.

Dask keeps annotations on the layers of a HighLevelGraph (``dask.annotate`` around the code
that builds a collection). Its optimisation fuses tasks of several layers into one and drops
them (dask's docs tell users to switch optimisation off). zres reads them from the layers as
they were built, then gives each task of the optimised graph the annotations of every task it
was made of, by this rule (the *union*):

- ``resources``: every resource any part asks for, each at the largest amount a part asks
  (the parts run one after another in one process, so the largest is what it needs at once);
- ``priority``: the highest of the parts' (a fused task is as urgent as its most urgent part);
- ``retries``: the largest of the parts'.

A part with no annotation adds nothing. Annotations for the whole compute (``dask.annotate``
or ``zres.annotate`` around it, keywords of ``get``/``compute``) apply to every task; a task's
own annotations win over them, resource by resource.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

USED = ("resources", "priority", "retries")
# Annotations Dask itself uses while building graphs (not placement): ignored without a word.
_IGNORED_QUIETLY = frozenset({"fuse"})


@dataclass(frozen=True, slots=True)
class Options:
    """What one zres task asks for: hashable, so tasks asking alike share their checks."""

    resources: tuple[tuple[str, float], ...] = ()
    priority: int | None = None
    retries: int | None = None

    def union(self, other: Options) -> Options:
        """Both parts' needs at once, by the rule in the module's docstring."""
        amounts = dict(self.resources)
        for name, amount in other.resources:
            amounts[name] = max(amounts.get(name, amount), amount)
        return Options(tuple(sorted(amounts.items())), _highest(self.priority, other.priority),
                       _highest(self.retries, other.retries))

    def over(self, general: Options) -> Options:
        """These options, each not given taken from GENERAL; resources name by name."""
        return Options(tuple(sorted({**dict(general.resources), **dict(self.resources)}.items())),
                       general.priority if self.priority is None else self.priority,
                       general.retries if self.retries is None else self.retries)


def _highest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def options(annotations: Mapping[str, Any], where: str) -> Options:
    """The zres options of one task's (or layer's, or compute's) ANNOTATIONS; WHERE names
    it in the error a bad value gets."""
    resources = annotations.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise TypeError(f"{where}: the resources annotation must be a mapping of names to "
                        f"amounts, not {type(resources).__name__}")
    for name, amount in resources.items():
        if not isinstance(name, str) or isinstance(amount, bool) \
                or not isinstance(amount, (int, float)):
            raise TypeError(f"{where}: resources annotation {name!r}: {amount!r} is not an "
                            "amount (a resource name mapped to a number)")
    return Options(tuple(sorted(resources.items())),
                   _whole(annotations.get("priority"), "priority", where),
                   _whole(annotations.get("retries"), "retries", where))


def _whole(value: Any, label: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{where}: the {label} annotation must be a whole number, got "
                         f"{value!r}")
    return int(value)


class GraphAnnotations:
    """The annotations of a graph's tasks as Dask built them, looked up for the parts of
    each task of the optimised graph."""

    def __init__(self) -> None:
        self._by_key: dict[Any, Options] = {}
        # Layer name -> its annotations (values may be callables of a key): a fused task
        # names its parts after their layers (blockwise fusion's inner keys).
        self._by_layer: dict[str, Mapping[str, Any]] = {}
        self._cache: dict[tuple[str, Any], Options] = {}
        self.ignored: set[str] = set()

    @classmethod
    def read(cls, dsk: Any) -> GraphAnnotations:
        """Read the layer annotations of DSK: an expression (what ``dask.compute`` hands a
        scheduler), a HighLevelGraph, or a plain graph (which has none)."""
        found = cls()
        for graph in _high_level_graphs(dsk):
            for name, layer in graph.layers.items():
                if layer.annotations:
                    found._add_layer(name, layer)
        if found.ignored:
            warnings.warn("zres runs Dask graphs with the annotations "
                          f"{', '.join(USED)}; it ignores {', '.join(sorted(found.ignored))}",
                          stacklevel=4)
        return found

    def _add_layer(self, name: str, layer: Any) -> None:
        annotations = layer.annotations
        self.ignored.update(set(annotations) - set(USED) - _IGNORED_QUIETLY)
        used = {k: v for k, v in annotations.items() if k in USED}
        if not used:
            return
        self._by_layer[name] = used
        for key in layer.get_output_keys():
            self._by_key[key] = self._evaluate(used, key)

    def _evaluate(self, used: Mapping[str, Any], key: Any) -> Options:
        values = {k: (v(key) if callable(v) else v) for k, v in used.items()}
        # Merging layers built in and out of ``dask.annotate`` gives each a callable that
        # answers a tombstone for the keys that had no such annotation: none, for zres too.
        return options({k: v for k, v in values.items() if not _is_tombstone(v)},
                       f"Dask task {key!r}")

    def of(self, node: Any) -> Options:
        """The union of the annotations of NODE (a task of the optimised graph) and of
        every task fused into it."""
        result = Options()
        if not self._by_layer:
            return result
        for key, index in parts(node, ()):
            found = self._by_key.get(key)
            if found is None:
                found = self._of_layer(key, index)
            if found is not None:
                result = result.union(found)
        return result

    def _of_layer(self, key: Any, index: tuple[Any, ...]) -> Options | None:
        """A fused part's annotations by its layer: its key's name, or (a blockwise inner
        key such as ``func-<token>_.0_.1``) the longest layer name it starts with."""
        name = key[0] if isinstance(key, tuple) and key else key
        if not isinstance(name, str):
            return None
        layer = name if name in self._by_layer else _layer_prefix(name, self._by_layer)
        if layer is None:
            return None
        # A callable annotation is asked for the part's own key, else the block it
        # computes (its enclosing task's index).
        raw = key if isinstance(key, tuple) else (layer, *index)
        cached = self._cache.get((layer, raw))
        if cached is None:
            cached = self._cache[(layer, raw)] = self._evaluate(self._by_layer[layer], raw)
        return cached


def _is_tombstone(value: Any) -> bool:
    """Whether VALUE is Dask's mark of a key built outside the annotation (a private class,
    looked up by name so that a Dask without it changes nothing)."""
    return type(value).__name__ == "_AnnotationsTombstone"


def _layer_prefix(name: str, layers: Mapping[str, Any]) -> str | None:
    end = name.rfind("_")
    while end > 0:
        if name[:end] in layers:
            return name[:end]
        end = name.rfind("_", 0, end)
    return None


def parts(node: Any, index: tuple[Any, ...], key: Any = None
           ) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Yield (key, block index) for NODE and each task fused into it, however deep. A
    fused part is named by its key in the fused subgraph (its own may be None)."""
    key = getattr(node, "key", None) if key is None else key
    if isinstance(key, tuple) and len(key) > 1:
        index = key[1:]
    yield key, index
    has_subgraph: Callable[[], bool] | None = getattr(node, "has_subgraph", None)
    if has_subgraph is not None and has_subgraph() and node.args \
            and isinstance(node.args[0], Mapping):
        for inner_key, inner in node.args[0].items():
            yield from parts(inner, index, inner_key)


def _high_level_graphs(dsk: Any) -> Iterator[Any]:
    """The HighLevelGraphs inside DSK, as they were before optimisation."""
    from dask.highlevelgraph import HighLevelGraph

    if isinstance(dsk, HighLevelGraph):
        yield dsk
        return
    try:
        from dask._expr import Expr, HLGExpr
    except ImportError:  # a Dask without expressions hands schedulers plain graphs
        return
    if isinstance(dsk, Expr):
        for expr in dsk.walk():
            if isinstance(expr, HLGExpr):
                yield expr.hlg
