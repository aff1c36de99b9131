"""The cluster's CURVE keys: made by ``zres keygen``, found by every peer, put on sockets.

A keys directory holds the broker's key pair (``broker.key``, ``broker.key_secret``) and
one pair per key made for a role: ``ROLE.key`` / ``ROLE.key_secret`` for the default key
of each role (client, agent, admin), ``ROLE-NAME.key`` / ``...key_secret`` for a named
one. The files are pyzmq's (``zmq.auth.create_certificates``); the crypto is libzmq's.

The broker lets in exactly the public keys in its directory besides its own, each as
the role and name its file says (a key's name is its owner's name). A peer needs the
broker's public key and one secret key of its own: the only one in its directory, or
else the one for its role.

Where a peer looks: the directory given (``--keys``, ``Client(keys=...)``), then
``$ZRES_KEYS``, then ``keys`` in the config file's ``[security]``, then this user's own
directory (``$XDG_CONFIG_HOME/zres/keys``), which a broker started with no keys makes on
its first start.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

from .errors import ZresError

ROLES = ("client", "agent", "admin")
BROKER = "broker"
# (a name may hold '-', as host names do: the role is always one of three words)
_STEM = re.compile(r"(client|agent|admin)(?:-([A-Za-z0-9_.@][A-Za-z0-9_.@-]{0,63}))?")


class KeysError(ZresError):
    """Keys are missing, unreadable, or a peer was refused for its key."""


@dataclass(frozen=True)
class PeerKey:
    """What a peer needs: the broker's public key and its own pair (z85)."""

    directory: str
    server: bytes
    public: bytes
    secret: bytes
    role: str
    name: str


def default_dir() -> Path:
    """This user's own keys directory."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base, "zres", "keys")


def keygen(directory: str | os.PathLike[str], role: str | None = None,
           name: str | None = None, force: bool = False,
           agents: Sequence[str] = ()) -> list[Path]:
    """Make a cluster's keys in DIRECTORY (0700): the broker's pair and each role's
    default pair, or (ROLE and NAME) one more named pair, or one agent pair per node of
    AGENTS (``agent-NODE``: that node's own, so that it alone may register as NODE, and
    removing its file revokes it; in a directory with no keys yet, with the broker's,
    client's and admin's, and no shared agent key). Refuse to overwrite a key unless
    FORCE. Return the secret files made."""
    path = Path(directory)
    fresh = not (path / f"{BROKER}.key").exists()
    if role is not None or agents:
        named = [(role, name)] if role is not None else [("agent", a) for a in agents]
        for each_role, each_name in named:
            if each_role not in ROLES or not each_name \
                    or not _STEM.fullmatch(f"{each_role}-{each_name}"):
                raise ValueError(f"a key needs a role ({', '.join(ROLES)}) and a name of "
                                f"letters, digits and _.@- (got role {each_role!r}, name "
                                f"{each_name!r})")
        stems = [f"{r}-{n}" for r, n in named]
        if agents and fresh:
            stems = [BROKER, "client", "admin", *stems]
    else:
        stems = [BROKER, *ROLES]
    taken = [s for s in stems if (path / f"{s}.key_secret").exists()]
    if taken and not force:
        raise KeysError(f"{path} already holds keys {', '.join(taken)} (--force replaces "
                        "them, and every peer then needs the new ones)")
    if role is not None and fresh:
        raise KeysError(f"{path} holds no cluster keys yet: run `zres keygen {path}` first")
    made = []
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        for stem in stems:
            public, secret = zmq.auth.create_certificates(str(path), stem)
            os.chmod(secret, 0o600)
            os.chmod(public, 0o644)
            made.append(Path(secret))
    except OSError as exc:  # (not a directory, read-only, not ours)
        raise KeysError(f"cannot make keys in {path}: {exc.strerror or exc}") from None
    return made


def _pair(path: Path) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise KeysError(f"cannot read key {path}: {exc}") from None


def broker_pair(directory: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """The broker's own key pair in DIRECTORY."""
    public, secret = _pair(Path(directory, f"{BROKER}.key_secret"))
    if secret is None:
        raise KeysError(f"{directory}/{BROKER}.key_secret holds no secret key")
    return public, secret


def allowed(directory: str | os.PathLike[str]) -> dict[bytes, tuple[str, str]]:
    """The public keys the broker lets in: z85 key -> (role, name)."""
    out: dict[bytes, tuple[str, str]] = {}
    for path in sorted(Path(directory).glob("*.key")):
        match = _STEM.fullmatch(path.stem)
        if match is not None:
            try:
                public, _ = _pair(path)
            except KeysError:
                continue  # unreadable (half written, or not a key): it lets nobody in
            if public:
                out[public] = (match[1], match[2] or match[1])
    return out


def exposed(directory: str | os.PathLike[str]) -> list[str]:
    """What in the keys DIRECTORY others than its owner may use: the directory if they
    may write to it (a public key put there lets its holder in), each secret key they
    may read (its holder is that peer). Empty when all is private."""
    path, found = Path(directory), []
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o022:
        found.append(f"{path} is writable by others (mode {mode:04o})")
    for secret in sorted(path.glob("*.key_secret")):
        mode = stat.S_IMODE(secret.stat().st_mode)
        if mode & 0o044:
            found.append(f"{secret} is readable by others (mode {mode:04o})")
    return found


def peer_key(directory: str | os.PathLike[str], roles: tuple[str, ...],
             name: str | None = None) -> PeerKey:
    """The key a peer uses in DIRECTORY: ROLES[0]-NAME's if NAME is given and it is
    there (an agent's own key, called by its name), else its only secret key there, else
    the first found of ROLES' default keys."""
    path = Path(directory)
    if not (path / f"{BROKER}.key").exists():
        raise KeysError(f"no broker key ({BROKER}.key) in {path}: copy the cluster's keys "
                        "there (see `zres keygen`)")
    server, _ = _pair(path / f"{BROKER}.key")
    mine = [p for p in sorted(path.glob("*.key_secret")) if _STEM.fullmatch(p.name[:-11])]
    own = path / f"{roles[0]}-{name}.key_secret"
    if name and own.exists():
        mine = [own]
    elif len(mine) != 1:
        mine = [path / f"{role}.key_secret" for role in roles
                if (path / f"{role}.key_secret").exists()][:1]
    if not mine:
        raise KeysError(f"no secret key for a {roles[0]} in {path} (looked for "
                        f"{', '.join(r + '.key_secret' for r in roles)})")
    public, secret = _pair(mine[0])
    if secret is None:
        raise KeysError(f"{mine[0]} holds no secret key")
    match = _STEM.fullmatch(mine[0].name[:-11])
    assert match is not None
    return PeerKey(str(path), server, public, secret, match[1], match[2] or match[1])


# Keys of clusters this process started (LocalCluster): a client of one finds them here.
_local: dict[str, str] = {}


def remember(address: str, directory: str | None) -> None:
    """Clients in this process connecting to ADDRESS use the keys in DIRECTORY (None:
    none, a cluster started insecure)."""
    _local[address] = directory or ""


def forget(address: str) -> None:
    _local.pop(address, None)


def find(given: str | None, roles: tuple[str, ...], address: str = "",
         configured: str | None = None, name: str | None = None) -> PeerKey | None:
    """The key a peer (called NAME, if it has one) connecting to ADDRESS uses: from
    GIVEN, a cluster this process started, $ZRES_KEYS, CONFIGURED ([security] keys), then
    this user's own directory; None if there is none anywhere (it connects without
    CURVE, and a secure broker refuses it, saying so)."""
    if not given and _local.get(address) == "":
        return None  # a cluster this process started without keys
    for directory in (given, _local.get(address), os.environ.get("ZRES_KEYS"), configured):
        if directory:
            return peer_key(directory, roles, name)
    if (default_dir() / f"{BROKER}.key").exists():
        return peer_key(default_dir(), roles, name)
    return None


def secure(sock: zmq.Socket[Any], key: PeerKey | None) -> None:
    """Make SOCK (not connected yet) talk CURVE with KEY's broker (nothing if None)."""
    if key is not None:
        sock.curve_serverkey = key.server
        sock.curve_publickey = key.public
        sock.curve_secretkey = key.secret


_DEFINITE = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
HANDSHAKES = (_DEFINITE | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
              | zmq.EVENT_HANDSHAKE_SUCCEEDED)


class Handshakes:
    """Count a socket's failed CURVE handshakes (fed its monitor's events): a broker that
    refuses a key says so at once (auth, protocol); a wrong broker key shows only as
    handshakes that fail with no detail, again and again."""

    def __init__(self, address: str, key: PeerKey | None) -> None:
        self._address = address
        self._key = key
        self._vague = 0

    def refused(self, event: int) -> str | None:
        """Why the broker refuses us, if EVENT (a monitor event) settles that it does."""
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._vague = 0
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self._vague += 1
        if event & _DEFINITE or self._vague >= 3:
            return refusal(self._key)
        return None


def refusal(key: PeerKey | None) -> str:
    """Why a broker refused a peer with KEY at the handshake, for its user."""
    if key is None:
        return ("it has no key, and the broker requires one (give --keys DIR or "
                "$ZRES_KEYS; see `zres keygen`)")
    return (f"its key {key.role}:{key.name} from {key.directory} is not one of the "
            "broker's keys, or the broker is not the one whose key it holds (see "
            "`zres keygen`)")
