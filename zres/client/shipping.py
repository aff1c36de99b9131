"""Ship code by value: functions and classes of the modules named travel inside the
pickles, so agents run them without those modules installed or importable.

A module a client imports from its own directory (``import mymodule`` beside the script)
is pickled by reference, as its name: an agent, whose working directory and ``sys.path``
differ, then fails the task with ``ModuleNotFoundError``. Shipping it
(``cloudpickle.register_pickle_by_value``) sends its code with every call instead.
"""

from __future__ import annotations

from types import ModuleType

import cloudpickle

from ..core.serialize import forget_functions


class Shipping:
    """What a client has to ship code (``Client(modules=[...])`` calls it too)."""

    def ship(self, *modules: ModuleType) -> None:
        """Send the functions and classes of MODULES (modules, or packages with their
        submodules) by value from now on, from every client of this process."""
        for module in modules:
            if not isinstance(module, ModuleType):
                raise TypeError(f"ship() takes modules, not {type(module).__name__} "
                                f"{module!r:.80}: pass the module object itself "
                                "(import mymodule; client.ship(mymodule))")
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
        forget_functions()  # (pickled by reference so far: by value from now on)
