"""Who may reach the broker, and what each may send.

With keys, the broker's socket speaks CURVE (libzmq's): a peer gets in only with a secret
key whose public half is in the broker's keys directory, checked by pyzmq's ZAP
``Authenticator``, served from the broker's own loop (no thread of its own). libzmq then
stamps every message with its sender's key as ``User-Id`` ("role:name"), and each
message is checked against the role before any handler reads it:
- agents register, report and answer log requests;
- clients submit, ask, release, cancel and read the logs of their own work;
- admins do what clients do, to anyone's work, and change agents' capacity.
The directory is read again when it changes: a key whose file is removed is refused
from its next connection on.

Without keys (``--insecure``) everyone may send anything, as one role-less owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import zmq
from zmq.auth.base import Authenticator

from ..core import keys as K
from ..core import protocol as P
from ..logs import get_logger

log = get_logger("zres.broker")

_CLIENT = {P.HELLO, P.SUBMIT, P.RELEASE, P.CANCEL, P.WHY, P.RESUME, P.STATUS, P.KILL,
           P.LOOKUP, P.JOBS, P.JOB_CANCEL, P.LOGS, P.HEARTBEAT, P.BYE}
MAY_SEND = {
    "client": frozenset(_CLIENT),
    "admin": frozenset(_CLIENT | {P.RESOURCES}),
    "agent": frozenset({P.REGISTER, P.REPORT, P.HOLDING, P.DRAIN, P.HEARTBEAT, P.BYE,
                        P.LOGS_REPLY, P.STATUS, P.OUTPUT}),
}
# Requests about one job or actor: only its owner or an admin may make them.
OWNED = frozenset({P.JOB_CANCEL, P.LOGS, P.KILL})


class _KeyCheck(Authenticator):
    """pyzmq's ZAP handler, with the keys read from a zres keys directory."""

    def __init__(self, ctx: zmq.Context[Any], directory: str) -> None:
        super().__init__(ctx)
        self._directory = directory
        self._stamp = 0.0
        self._keys: dict[bytes, tuple[str, str]] = {}
        self.configure_curve_callback("*", self)

    def callback(self, domain: str, key: bytes) -> bool:
        """Whether the public KEY (z85) is one of ours (the credentials provider)."""
        try:
            stamp = os.stat(self._directory).st_mtime
            if stamp != self._stamp:  # a key added or removed since
                self._keys, self._stamp = K.allowed(self._directory), stamp
        except (OSError, K.KeysError) as exc:  # (a file half written: the keys known so far)
            log.error("keys_unreadable", dir=self._directory, error=str(exc))
        if key not in self._keys:
            log.warning("key_refused", key=key.decode()[:12])
            return False
        return True

    def curve_user_id(self, client_public_key: bytes) -> str:
        role, name = self._keys[zmq.utils.z85.encode(client_public_key)]
        return f"{role}:{name}"


class Gate:
    """The broker's door: CURVE and the ZAP handler with KEYS (a directory), or none."""

    def __init__(self, ctx: zmq.Context[Any], keys: str | None) -> None:
        self.keys = keys
        self._check: _KeyCheck | None = None
        if keys is not None:
            self._public, self._secret = K.broker_pair(keys)
            self._check = _KeyCheck(ctx, keys)
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
    def sender(frame: Any) -> tuple[str, str]:
        """The role and name of the key that sent the message whose first frame is FRAME
        ("", "" without keys)."""
        try:
            role, _, name = frame.get("User-Id").partition(":")
        except zmq.ZMQError:  # (no such property: a message of no connection)
            return "", ""
        return (role, name) if role in MAY_SEND else ("", "")

    def refuses(self, role: str, kind: str) -> str | None:
        """Why a ROLE key may not send KIND (None if it may)."""
        if self._check is None or kind in MAY_SEND.get(role, ()):
            return None
        return f"a {role or 'role-less'} key may not send {kind}"

    def close(self) -> None:
        if self._check is not None:
            self._check.stop()


class Forbidden(Exception):
    """A key may not send what it sent: refused to it, naming why."""
