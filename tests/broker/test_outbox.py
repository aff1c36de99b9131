"""Per-peer batches: what a turn's flush sends, and news dropped that a result says."""

from __future__ import annotations

from typing import Any

from zres.broker.outbox import Batches


def test_news_a_result_in_the_same_flush_says_is_dropped() -> None:
    sent: list[tuple[bytes, str, dict[str, Any]]] = []
    running = Batches(lambda ident, kind, body=None, frames=(): sent.append(
        (ident, kind, body or {})), "running", "ids")
    running.add(b"alice", 1)
    running.add(b"alice", 2)
    running.add(b"bob", 1)
    assert running.peers() == [b"alice", b"bob"]
    running.discard(b"alice", {2, 3})
    running.discard(b"bob", {1})  # (bob's batch is left empty: nothing goes to bob)
    running.discard(b"carol", {1})  # (nothing waits for carol)
    running.flush()
    assert sent == [(b"alice", "running", {"ids": [1]})]


def test_keys_of_names_the_items_waiting_for_a_peer() -> None:
    results = Batches(lambda *a, **k: None, "results", "results")
    results.add(b"alice", [7, "ok", 1, {}], [b"x"])
    results.add(b"alice", [9, "raised", 1, {}], [b"y"])
    assert results.keys_of(b"alice") == {7, 9}
    assert results.keys_of(b"bob") == set()
