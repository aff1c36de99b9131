"""Annotations: defaults for every submit inside a ``with zres.annotate(...)`` block."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

_annotations: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "zres_annotations", default=MappingProxyType({}))

_ANNOTATABLE = frozenset({"resources", "priority", "retries", "infeasible"})


@contextlib.contextmanager
def annotate(**defaults: Any) -> Iterator[None]:
    """Use DEFAULTS (resources=, priority=, retries=, infeasible=) for submits inside.

    Blocks nest: an inner block's resources are merged over the outer's, and an explicit
    argument to submit wins over both.
    """
    unknown = set(defaults) - _ANNOTATABLE
    if unknown:
        raise TypeError(f"annotate() got unknown settings: {', '.join(sorted(unknown))}; "
                        f"expected {', '.join(sorted(_ANNOTATABLE))}")
    outer = _annotations.get()
    merged = {**outer, **defaults}
    if isinstance(outer.get("resources"), Mapping) and isinstance(defaults.get("resources"),
                                                                  Mapping):
        merged["resources"] = {**outer["resources"], **defaults["resources"]}
    token = _annotations.set(merged)
    try:
        yield
    finally:
        _annotations.reset(token)


def current_annotations() -> Mapping[str, Any]:
    return _annotations.get()
