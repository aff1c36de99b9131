"""Dask collections on zres: arrays, bags, delayed and dataframes, with their annotations.

    import dask, zres
    client = zres.Client()
    with dask.annotate(resources={"GPU": 1}):
        y = x.map_blocks(on_gpu)
    y.sum().compute(scheduler=client.get)      # or dask.config.set(scheduler=zres.dask.get)
    futures = client.compute([y.sum(), z])       # zres futures

Needs Dask (``pip install zres[dask]``) where the client runs and on the agents.
"""

from __future__ import annotations

from typing import Any

from ..client import registry


def get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """A Dask scheduler on the default client (the newest open one, started if none):
    see ``Client.get``."""
    return registry.default().get(dsk, keys, **kwargs)


def compute(collections: Any, **kwargs: Any) -> Any:
    """Start computing Dask COLLECTIONS on the default client; return zres futures: see
    ``Client.compute``."""
    return registry.default().compute(collections, **kwargs)


__all__ = ["compute", "get"]
