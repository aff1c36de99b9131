"""The environments command jobs carry from their submitters, each kept once.

``zres submit`` exports the submitter's environment (sbatch's ``--export=ALL``): often a
few kilobytes, and the same for every job of a ``--file`` or of a program's loop. The
broker keeps each distinct environment once, by a digest of its contents, with a count of
the queued and running jobs that use it: in memory the jobs share one dict, and the state
store holds it once (``envs`` table) with each job's record naming its digest. A job that
ends lets go of its environment (it never runs again); the last one to let go removes it.
"""

from __future__ import annotations

import hashlib

import msgpack

from .store import Store


def digest(env: dict[str, str]) -> str:
    """A name for ENV's contents, whatever the order of its variables."""
    packed = msgpack.packb(sorted(env.items()), use_bin_type=True)
    return hashlib.blake2b(packed, digest_size=16).hexdigest()


class JobEnvs:
    """The exported environments in use, each once, counted; kept in STORE if given."""

    def __init__(self, store: Store | None = None) -> None:
        self._store = store
        self._envs: dict[str, tuple[dict[str, str], int]] = {}   # digest -> env, users

    def take(self, env: dict[str, str]) -> tuple[dict[str, str], str]:
        """Count one more user of ENV; return the dict kept for it (shared by every job
        with the same environment) and its digest ("" for an empty one, never kept)."""
        if not env:
            return {}, ""
        key = digest(env)
        known = self._envs.get(key)
        if known is None:
            known = (env, 0)
            if self._store is not None:
                self._store.put_env(key, env)
        self._envs[key] = (known[0], known[1] + 1)
        return known[0], key

    def restored(self, key: str, kept: dict[str, dict[str, str]]) -> dict[str, str] | None:
        """Count one more user of the environment KEY that a previous life kept (KEPT, as
        read from the store); None if it was not kept."""
        known = self._envs.get(key)
        if known is None:
            env = kept.get(key)
            if env is None:
                return None
            known = (env, 0)
        self._envs[key] = (known[0], known[1] + 1)
        return known[0]

    def drop_unused(self, kept: dict[str, dict[str, str]]) -> None:
        """Remove from the store what KEPT holds that no job uses (after a restore)."""
        if self._store is not None:
            for key in kept.keys() - self._envs.keys():
                self._store.forget_env(key)

    def release(self, key: str) -> None:
        """One user of the environment KEY is done with it; the last one removes it."""
        known = self._envs.get(key)
        if known is None:
            return
        if known[1] > 1:
            self._envs[key] = (known[0], known[1] - 1)
            return
        del self._envs[key]
        if self._store is not None:
            self._store.forget_env(key)

    def __len__(self) -> int:
        return len(self._envs)
