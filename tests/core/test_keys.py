"""Which key a peer takes from a keys directory, and which keys a broker lets in."""

from __future__ import annotations

import os
import shutil

import pytest

from zres.core import keys as K

pytestmark = pytest.mark.timeout(30)


def test_a_peer_takes_its_only_key_or_else_its_roles(tmp_path):
    cluster = tmp_path / "cluster"
    K.keygen(cluster)
    K.keygen(cluster, "client", "alice")
    assert K.peer_key(cluster, ("agent",)).role == "agent"
    assert (K.peer_key(cluster, ("admin", "client")).role,
            K.peer_key(cluster, ("admin", "client")).name) == ("admin", "admin")
    mine = tmp_path / "alice"
    mine.mkdir()
    for name in ("broker.key", "client-alice.key_secret"):
        shutil.copy(cluster / name, mine / name)
    key = K.peer_key(mine, ("admin", "client"))
    assert (key.role, key.name) == ("client", "alice"), "her only key is not taken"
    assert key.server == K.broker_pair(cluster)[0]
    assert K.allowed(cluster)[key.public] == ("client", "alice")
    assert K.broker_pair(cluster)[0] not in K.allowed(cluster), "the broker lets itself in"


def test_missing_keys_are_named(tmp_path):
    with pytest.raises(K.KeysError, match="no broker key"):
        K.peer_key(tmp_path, ("client",))
    K.keygen(tmp_path / "c")
    only_broker = tmp_path / "only-broker"
    only_broker.mkdir()
    shutil.copy(tmp_path / "c" / "broker.key", only_broker / "broker.key")
    with pytest.raises(K.KeysError, match="no secret key for a agent"):
        K.peer_key(only_broker, ("agent",))
    with pytest.raises(K.KeysError, match="run `zres keygen"):
        K.keygen(tmp_path / "empty", "client", "bob")
    with pytest.raises(ValueError, match="a role"):  # (a usage error: exit 2)
        K.keygen(tmp_path / "c", "client", "no spaces")


def test_keys_that_cannot_be_made_there_are_an_error_naming_the_place(tmp_path):
    """(`zres keygen FILE`, or a broker's first start on a read-only keys directory, ended
    in a traceback.)"""
    (tmp_path / "a-file").write_text("")
    with pytest.raises(K.KeysError, match=f"cannot make keys in {tmp_path}/a-file: "):
        K.keygen(tmp_path / "a-file")
    with pytest.raises(K.KeysError, match="cannot make keys in .*a-file/keys: "):
        K.keygen(tmp_path / "a-file" / "keys", agents=["n1"])


def test_a_peer_finds_keys_in_order(tmp_path, monkeypatch):
    given, env, own = tmp_path / "given", tmp_path / "env", tmp_path / "config"
    for where in (given, env):
        K.keygen(where)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(own))
    monkeypatch.delenv("ZRES_KEYS", raising=False)
    assert K.find(None, ("client",), "tcp://x:1") is None, "no keys anywhere"
    K.keygen(own / "zres" / "keys")
    assert K.find(None, ("client",), "tcp://x:1").directory == str(own / "zres" / "keys")
    monkeypatch.setenv("ZRES_KEYS", str(env))
    assert K.find(None, ("client",), "tcp://x:1").directory == str(env)
    assert K.find(str(given), ("client",), "tcp://x:1").directory == str(given)
    K.remember("tcp://x:1", None)
    try:
        assert K.find(None, ("client",), "tcp://x:1") is None, "a cluster started insecure"
    finally:
        K.forget("tcp://x:1")


def test_keys_others_may_use_are_named(tmp_path):
    """A keys directory others may write to lets in whoever adds a key there; a secret key
    others may read lets them act as its peer: the broker warns of both at start, as it
    does of a state directory others may read."""
    keys = tmp_path / "keys"
    K.keygen(keys)
    assert K.exposed(keys) == []
    os.chmod(keys, 0o777)
    os.chmod(keys / "client.key_secret", 0o644)
    found = K.exposed(keys)
    assert any("is writable by others (mode 0777)" in f for f in found)
    assert any("client.key_secret is readable by others (mode 0644)" in f for f in found)
