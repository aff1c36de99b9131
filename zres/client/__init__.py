"""The client side, in the user's process: ``client`` (the Client), ``io`` (its I/O thread,
the one owner of its socket), ``futures``, ``actors`` (actor handles), ``annotations``
(``zres.annotate``) and ``registry`` (the default client).
"""

# Imported with the package: whatever part of the client a process loads first (an actor
# handle or placement group unpickled in a task, zres.dask), the client module is there to
# make it a default client (``registry.set_factory``), as ``import zres`` once saw to.
from . import client as client
