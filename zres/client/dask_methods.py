"""The Dask face of ``zres.Client``: ``get`` (a Dask scheduler) and ``compute`` (futures).

Dask is imported only when these are called: zres itself does not depend on it
(``pip install zres[dask]``).
"""

from __future__ import annotations

from typing import Any


class DaskMethods:
    """Mixed into ``Client``: run Dask graphs and collections on the cluster (the work is
    done in ``zres.dask``)."""

    def get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """Compute KEYS of the Dask graph DSK on this cluster: a Dask scheduler.

        ``x.compute(scheduler=client.get)``, ``dask.compute(x, y, scheduler=client.get)`` or
        ``dask.config.set(scheduler=client.get)``. Every task of the graph runs as a zres task
        with the ``resources``, ``priority`` and ``retries`` annotations of the tasks it was
        made of, read before Dask optimises the graph (see ``zres.dask.annotations`` for the
        rule); KWARGS ``resources``, ``priority``, ``retries`` apply to every task under its
        own annotations, as ``dask.annotate`` or ``zres.annotate`` around the compute do;
        ``workers`` and ``allow_other_workers`` place every task as ``submit``'s do.
        ``callbacks`` (or active ``dask.callbacks.Callback`` objects, such as
        ``dask.diagnostics.ProgressBar``) hear each task begin and end. A failed task fails
        the compute with its own exception, naming its key.
        """
        _need_dask()
        from ..dask.plan import make_plan
        from ..dask.run import WHERE_KEYWORDS, general_options, get

        callbacks = kwargs.get("callbacks")
        where = {k: kwargs.pop(k) for k in WHERE_KEYWORDS if k in kwargs}
        plan = make_plan(dsk, keys, general_options(kwargs))
        return get(self, plan, keys, callbacks, where)

    def compute(self, collections: Any, *, optimize_graph: bool = True,
                **kwargs: Any) -> Any:
        """Start computing COLLECTIONS (one Dask collection, or a list or tuple of them);
        return a zres future for each, which ``submit`` takes as an argument like any other.

        Annotations are honoured as in ``get``; KWARGS are ``resources``, ``priority``,
        ``retries``, ``workers`` and ``allow_other_workers`` for every task. Intermediate
        results are freed as soon as the tasks that read them have ended.
        """
        _need_dask()
        import dask

        from ..dask.plan import make_plan
        from ..dask.run import WHERE_KEYWORDS, compute, general_options

        where = {k: kwargs.pop(k) for k in WHERE_KEYWORDS if k in kwargs}
        if "callbacks" in kwargs:
            raise TypeError("compute() returns at once: follow its futures with "
                            "zres.wait or as_completed rather than callbacks")
        general = general_options(kwargs)
        single = not isinstance(collections, (list, tuple))
        wanted = [collections] if single else list(collections)
        for each in wanted:
            if not dask.is_dask_collection(each):
                raise TypeError(f"compute() takes Dask collections, not {type(each).__name__}")

        def submit(dsk: Any, keys: Any, **_: Any) -> Any:
            from ..dask.plan import pack
            return pack(keys, compute(self, make_plan(dsk, keys, general), where))

        futures = list(dask.compute(*wanted, scheduler=submit, optimize_graph=optimize_graph))
        return futures[0] if single else type(collections)(futures)


def _need_dask() -> None:
    try:
        import dask  # noqa: F401
    except ImportError as exc:
        raise ImportError("running Dask collections on zres needs Dask: pip install "
                          "'zres[dask]' (where clients run and on the agents)") from exc
