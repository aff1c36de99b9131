"""Finding the broker a client talks to, or starting a private one.

One order everywhere (clients, every command, agents): the address given, then
``$ZRES_BROKER``, then ``broker`` in the config file (``[client]``; ``[agent]`` for
agents), then a broker answering at tcp://127.0.0.1:7070. Only a Python program goes
further: with no broker anywhere it starts a private cluster of its own, and says so.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any

from .. import config
from ..core import protocol as P
from ..core.address import unreachable
from ..core.errors import ZresError
from ..core.keys import KeysError

ORDER = ("the address given, $ZRES_BROKER, broker in zres.toml's [client] section, "
         f"a broker at {config.DEFAULT_ADDRESS}")


def find_broker(address: str | None, keys_dir: str | None = None) -> tuple[str, Any]:
    """Return the broker's address, and the private LocalCluster started for it (None
    for a broker found). ADDRESS: what the order's first three steps gave, if anything;
    KEYS_DIR: the client's ``keys``, which the broker at the default address is asked with."""
    if address is not None:
        return address, None
    if broker_answers(config.DEFAULT_ADDRESS, keys_dir=keys_dir):
        return config.DEFAULT_ADDRESS, None
    from ..local import LocalCluster
    cluster = LocalCluster()
    # This client closes it (at exit too, once its work is done), not the cluster's own
    # exit hook, which could run first and fail that work.
    atexit.unregister(cluster.close)
    print(f"zres: no broker found ({ORDER}); started a private cluster for this program "
          f"at {cluster.address}", file=sys.stderr, flush=True)
    return cluster.address, cluster


def broker_answers(address: str, timeout: float = 2.0, keys_dir: str | None = None) -> bool:
    """Whether a zres broker answers at ADDRESS (at once False if nothing listens), asked
    by a client with the keys in KEYS_DIR (else those found as ever)."""
    if unreachable(address) is not None:
        return False
    from ..local import request
    try:
        request(address, P.STATUS, {}, timeout, keys_dir, who="client")
    except KeysError:
        raise  # a broker there, that refuses us: say so, do not start another
    except ZresError:
        return False
    return True
