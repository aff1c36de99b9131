"""Who may reach the broker, and what each may send.

With keys, the broker's socket speaks CURVE (libzmq's): a peer gets in only with a secret
key whose public half is in the broker's keys directory, checked by pyzmq's ZAP
``Authenticator``, served from the broker's own loop (no thread of its own). libzmq then
stamps every message with its sender's key as ``User-Id`` ("role:name:public key"), and each
message is checked against the role before any handler reads it:
- agents register, report and answer log requests;
- clients submit, ask, release, cancel and read the logs of their own work;
- admins do what clients do, to anyone's work, and change agents' capacity.
The directory is read again when it changes (at each handshake, and on the broker's
heartbeat): a key whose file is removed (or replaced) is refused from then on, and the
broker ends its sessions (``Identities.revoke``).

A task the broker grants carries a *task token* (a MAC of the task's id, keyed BLAKE2b under
a key derived from the broker's secret key, so it outlives the broker's restarts with
nothing stored): a client made inside the task says it, and acts for the task's owner with
a client's powers (never more), whatever key the agent's host lent it.

Without keys (``--insecure``) everyone may send anything, as one role-less owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import time
from typing import Any

import zmq
from zmq.auth.base import Authenticator

from ..core import keys as K
from ..core import protocol as P
from ..logs import get_logger

log = get_logger("zres.broker")

_CLIENT = {P.HELLO, P.SUBMIT, P.RELEASE, P.CANCEL, P.WHY, P.RESUME, P.STATUS, P.KILL,
           P.LOOKUP, P.JOBS, P.JOB_CANCEL, P.LOGS, P.HEARTBEAT, P.BYE, P.TASK_CANCEL, P.GROUP,
           P.LOCATE, P.PLACE}
MAY_SEND = {
    "client": frozenset(_CLIENT),
    "admin": frozenset(_CLIENT | {P.RESOURCES}),
    "agent": frozenset({P.REGISTER, P.REPORT, P.HOLDING, P.DRAIN, P.HEARTBEAT, P.BYE,
                        P.LOGS_REPLY, P.STATUS, P.OUTPUT, P.DIRECT_DONE}),
}
# What a refused kind would have done, in its user's words (the rest are named by kind: no
# zres command or client sends them with the wrong key).
REFUSED_WORDS = {P.RESOURCES: "change an agent's capacity (zres resources takes an admin key)",
                 P.REGISTER: "register as an agent (zres agent takes an agent key: "
                             "agent.key_secret, or its own, agent-NAME.key_secret)"}
# Requests about one job or actor: only its owner or an admin may make them (what each
# does, in its user's words).
OWNED = {P.JOB_CANCEL: "cancel", P.LOGS: "read the log of", P.KILL: "kill",
         P.TASK_CANCEL: "cancel"}
_REFUSALS_KEPT = 10_000  # keys whose refused handshakes are being counted, at most


class _KeyCheck(Authenticator):
    """pyzmq's ZAP handler, with the keys read from a zres keys directory."""

    def __init__(self, ctx: zmq.Context[Any], directory: str) -> None:
        super().__init__(ctx)
        self._directory = directory
        self._stamp = -1
        self.keys: dict[bytes, tuple[str, str]] = {}
        self.names: frozenset[str] = frozenset()   # "role:name" of every key there
        self.generation = 0                         # how many times it was read
        # Refused handshakes per key: when one was last logged, and how many since.
        self._refusals: dict[bytes, list[float]] = {}
        self.clock = time.monotonic
        self.configure_curve_callback("*", self)

    def reload(self) -> None:
        """Read the directory again if a key was added, removed or replaced since."""
        try:
            stamp = os.stat(self._directory).st_mtime_ns
            if stamp != self._stamp:
                self.keys, self._stamp = K.allowed(self._directory), stamp
                self.names = frozenset(f"{role}:{name}" for role, name in self.keys.values())
                self.generation += 1
        except (OSError, K.KeysError) as exc:  # (a file half written: the keys known so far)
            log.error("keys_unreadable", dir=self._directory, error=str(exc))

    def callback(self, domain: str, key: bytes) -> bool:
        """Whether the public KEY (z85) is one of ours (the credentials provider)."""
        self.reload()
        if key not in self.keys:
            self._refused(key)
            return False
        return True

    def _refused(self, key: bytes) -> None:
        """Log a refused handshake of KEY: at most once a second per key, with how many
        there were (a peer retrying in a loop must not fill the broker's log)."""
        now = self.clock()
        seen = self._refusals.get(key)
        if seen is not None and now - seen[0] < 1.0:
            seen[1] += 1
            return
        if len(self._refusals) >= _REFUSALS_KEPT:
            self._refusals.clear()
        log.warning("key_refused", key=key.decode()[:12],
                    refused=1 + (int(seen[1]) if seen is not None else 0))
        self._refusals[key] = [now, 0]

    def curve_user_id(self, client_public_key: bytes) -> str:
        public = zmq.utils.z85.encode(client_public_key)
        role, name = self.keys[public]
        # The public key too: a key replaced under the same name is not the one let in.
        return f"{role}:{name}:{public.decode()}"


class Gate:
    """The broker's door: CURVE and the ZAP handler with KEYS (a directory), or none."""

    def __init__(self, ctx: zmq.Context[Any], keys: str | None) -> None:
        self.keys = keys
        self._check: _KeyCheck | None = None
        self._tokens = b""
        if keys is not None:
            self._public, self._secret = K.broker_pair(keys)
            for what in K.exposed(keys):  # (as for the state directory: store)
                log.warning("keys_not_private", problem=what,
                            fix=f"chmod go-rwx {keys} and the secret keys in it")
            self._tokens = hashlib.blake2b(b"zres task tokens", key=self._secret[:64],
                                           digest_size=32).digest()
            self._check = _KeyCheck(ctx, keys)
            self._check.reload()
            self._check.start()  # binds the process's ZAP endpoint (inproc)

    @property
    def zap(self) -> zmq.Socket[Any] | None:
        """The socket ZAP requests arrive on (to poll), if any."""
        return self._check.zap_socket if self._check is not None else None

    def secure(self, sock: zmq.Socket[Any]) -> None:
        """Make SOCK (not bound yet) a CURVE server, if keys are used."""
        if self._check is not None:
            sock.curve_server = True
            sock.curve_publickey = self._public
            sock.curve_secretkey = self._secret

    def serve(self) -> None:
        """Answer the handshakes waiting (each is quick: a dictionary lookup)."""
        assert self._check is not None and self._check.zap_socket is not None
        while self._check.zap_socket.poll(0):
            request = self._check.zap_socket.recv_multipart()
            try:
                asyncio.run(self._check.handle_zap_message(request))
            except Exception:  # a bug: refuse this one, and keep answering (REP must reply)
                log.exception("zap_failed")
                if len(request) > 1:
                    with contextlib.suppress(zmq.ZMQError):  # (unless it had replied)
                        self._check.zap_socket.send_multipart(
                            [b"1.0", request[1], b"500", b"internal error", b"", b""])

    @staticmethod
    def sender(frame: Any) -> tuple[str, str, str]:
        """The role, name and public key of the key that sent the message whose first
        frame is FRAME ("", "", "" without keys)."""
        try:
            role, _, rest = frame.get("User-Id").partition(":")
        except zmq.ZMQError:  # (no such property: a message of no connection)
            return "", "", ""
        name, _, public = rest.partition(":")
        return (role, name, public) if role in MAY_SEND else ("", "", "")

    def current(self, public: str) -> bool:
        """Whether the public key PUBLIC (z85) is still in the keys directory."""
        return self._check is None or public.encode() in self._check.keys

    def names(self) -> frozenset[str]:
        """The keys in the directory, as "role:name"."""
        return self._check.names if self._check is not None else frozenset()

    def refresh(self) -> int:
        """Read the keys directory again if it changed; return how many times it has been
        read (a new number: a key may have been revoked)."""
        if self._check is None:
            return 0
        self._check.reload()
        return self._check.generation

    def token(self, subject: str) -> str:
        """The token of SUBJECT ("t" and a task id, "a" and an actor id): SUBJECT and its
        HMAC; "" without keys."""
        if not self._tokens:
            return ""
        # (blake2b keyed is a MAC, and a fifth of hmac's cost: one is made per grant)
        mac = hashlib.blake2b(subject.encode(), key=self._tokens, digest_size=16)
        return f"{subject}.{mac.hexdigest()}"

    def subject(self, token: Any) -> str | None:
        """The subject TOKEN was made for, if this broker made it (else None)."""
        if not self._tokens or not isinstance(token, str) or len(token) > 1000:
            return None
        subject = token.rpartition(".")[0]
        return subject if subject and hmac.compare_digest(
            token.encode(), self.token(subject).encode()) else None

    def refuses(self, role: str, kind: str) -> str | None:
        """Why a ROLE key may not send KIND (None if it may)."""
        if self._check is None or kind in MAY_SEND.get(role, ()):
            return None
        what = REFUSED_WORDS.get(kind, f"send {kind}")
        return f"a {role or 'role-less'} key may not {what}"

    def close(self) -> None:
        if self._check is not None:
            self._check.stop()


class Forbidden(Exception):
    """A key may not send what it sent: refused to it, naming why."""
