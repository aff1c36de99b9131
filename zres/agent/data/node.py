"""What the agent's loop does for the data plane: its store and data port started and
stopped, what the broker is told of them (where the port is, what is held), and what it
hears (the secret tokens are made with, objects to free)."""

from __future__ import annotations

import os
from typing import Any

from ...core import keys, wakeup
from ...core import protocol as P
from ...core.resources import MEMORY, UNIT
from ..reports import Reports
from ..slots import SlotSpec
from .server import DataServer, default_listen
from .store import ObjectStore

STORE_SHARE = 0.3  # of the agent's MEMORY (else of the host's), its store's default budget


class NodeData:
    """The agent's objects (``store``) and data port (``server``), in STATE_DIR."""

    def __init__(self, state_dir: str, slots: list[SlotSpec], broker: str,
                 key: keys.PeerKey | None, listen: str | None, budget: int | None,
                 reports: Reports, advertise: str | None = None) -> None:
        self.store = ObjectStore(state_dir, budget or default_budget(slots))
        self.server = DataServer(self.store, listen or default_listen(broker), broker, key,
                                 advertise)
        # What worker processes are told of the store (worker_side.ENV).
        self.env = f"{self.store.memory_dir}:{self.store.spill_dir}"
        self._reports = reports

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.store.close()

    def register_fields(self, new_session: bool) -> dict[str, Any]:
        """What a REGISTER says of the data plane: the port (where others reach it, its key,
        and where it is bound: the broker's relay reaches it there), and for a new session
        what is held (a broker restarted on its state takes back where its objects are)."""
        fields: dict[str, Any] = {"data": {"address": self.server.address,
                                           "key": self.server.key,
                                           "bound": self.server.bound}}
        if new_session:
            fields["objects"] = self.store.held()
        return fields

    def welcomed(self, msg: P.Message) -> None:
        secret = msg.body.get("data_secret")
        if isinstance(secret, bytes) and len(secret) >= 16:
            self.server.secret = secret

    def free(self, msg: P.Message) -> None:
        ids = [i for i in P.field(msg, "ids", list) if type(i) is int]
        self.server.forget(ids)
        self.store.free(ids)

    def forget_all(self) -> None:
        """The session's work is void (the broker gave up on this agent): so is what it
        held."""
        self.free_ids([object_id for object_id, _ in self.store.held()])

    def free_ids(self, ids: list[int]) -> None:
        self.server.forget(ids)
        self.store.free(ids)

    def from_worker(self, body: dict[str, Any]) -> None:
        """A worker's DONE: count the results it stored and the inputs it fetched."""
        for item in body.get("results", ()):
            info = item[3] if len(item) > 3 and isinstance(item[3], dict) else {}
            if isinstance(info.get("stored"), int):
                self.store.added(item[0], info["stored"])
        for object_id, size in body.get("replicas", ()):
            self.store.added(object_id, size)
            self._reports.stored(object_id, size)

    def turn(self) -> None:
        """Count and report the uploads the port has completed (its ``stored_fd`` read:
        it wakes the loop for them)."""
        wakeup.drain(self.server.stored_fd)
        while not self.server.stored.empty():
            object_id, size = self.server.stored.get_nowait()
            self.store.added(object_id, size)
            self._reports.stored(object_id, size)


def default_budget(slots: list[SlotSpec]) -> int:
    """STORE_SHARE of the MEMORY the slots offer, else of the host's memory."""
    memory = sum(slot.units.get(MEMORY, 0) for slot in slots) // UNIT
    if not memory:
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (OSError, ValueError):
            memory = 4 << 30
    return int(memory * STORE_SHARE)

