"""The broker's door (issue 26): what a flood of refused handshakes leaves in its log."""

from __future__ import annotations

import logging

import pytest
import zmq

from zres.broker.auth import _KeyCheck
from zres.core import keys as K

pytestmark = pytest.mark.timeout(30)


def test_refused_handshakes_are_logged_once_a_second_per_key_with_a_count(tmp_path, caplog):
    K.keygen(tmp_path)
    check = _KeyCheck(zmq.Context.instance(), str(tmp_path))
    now = [100.0]
    check.clock = lambda: now[0]
    stranger, other = b"s" * 40, b"o" * 40
    [ours] = [key for key, (role, _) in K.allowed(tmp_path).items() if role == "client"]
    with caplog.at_level(logging.WARNING, logger="zres.broker"):
        for _ in range(50):
            assert not check.callback("*", stranger)
        assert not check.callback("*", other) and check.callback("*", ours)
        now[0] = 100.5
        assert not check.callback("*", stranger)
        now[0] = 101.0
        assert not check.callback("*", stranger)
    logged = [(r.zres_event["key"], r.zres_event.get("refused")) for r in caplog.records
              if r.zres_event.get("event") == "key_refused"]
    assert logged == [("s" * 12, 1), ("o" * 12, 1), ("s" * 12, 51)]
