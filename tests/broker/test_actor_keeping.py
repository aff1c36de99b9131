"""Actors kept across a broker restart (issue 16), the broker stepped in this thread with
a client and an agent played by hand: what a restarted broker makes of an actor its
agent offers back, or does not, and of its calls."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.test_agent_link import Peer, report
from tests.broker.test_keeping import broker_on, hello, register, restarted, results
from zres.core import protocol as P
from zres.core.resources import UNIT

pytestmark = pytest.mark.timeout(30)


def create(client: Peer, restarts: int) -> None:
    spec = {"id": "a1", "name": "", "cls": "C", "methods": ["m"], "restarts": restarts}
    client.send(P.SUBMIT, {"tasks": [[1, {"foo": UNIT}, 0, 0, [], 2, "C", False,
                                      {"actor": spec}]]}, [b"cls", b"args"])


def call(client: Peer, local: int, retries: int = 0) -> None:
    client.send(P.SUBMIT, {"tasks": [[local, {}, 0, retries, [], 2, f"m{local}", False,
                                      {"call": "a1"}]]}, [b"m", b"args%d" % local])


def calls(agent: Peer) -> list[int]:
    """The ids of the calls sent to AGENT, waiting for one at least (the calls a report
    releases go after the turn's commit: behind the reply that ends ``sync``, if the
    broker read both in one turn)."""
    def of(messages: list[P.Message]) -> list[int]:
        return [c[0] for m in messages if m.kind == P.CALL for c in m.body["calls"]]
    return of(agent.sync()) or of([agent.take(P.CALL), *agent.sync()])


@contextlib.contextmanager
def started_again(state: Path) -> Iterator[tuple[Peer, Peer]]:
    """A broker started on STATE, with a client that said hello and an agent (not yet
    registered): the client and the agent, closed with the broker after."""
    broker = broker_on(state)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        yield client, agent
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def placed_when_the_broker_went(tmp_path: Path, restarts: int = 0, up: bool = True,
                                held: bool = True) -> tuple[int, list[int]]:
    """A broker whose agent ran actor a1 (UP: constructed; else its __init__ HELD, or
    only sent) with call 2 handed to its process and call 3 sent but not yet held, when it
    went; return the placement and the calls' ids."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    register(agent, session=1)
    create(client, restarts)
    [(placement, *_)] = agent.take(P.ASSIGN).body["tasks"]
    if held or up:
        report(agent, 1, 1, held=[placement])
    sent: list[int] = []
    if up:
        report(agent, 2, 1, [b"none"], results=[[placement, P.OK, 1, {}]])
        results(client)
        call(client, 2)
        call(client, 3)
        # (Two peers' messages reach the broker in no set order: once the client's own
        # status is answered its calls were taken, and sent before the agent's is.)
        client.sync()
        sent = calls(agent)
        report(agent, 3, 1, held=sent[:1])
    agent.sync()  # (taken in, and written at the end of that turn)
    broker.close()
    for peer in (client, agent):
        peer.close()
    return placement, sent


def test_an_actor_offered_back_runs_on_and_gets_the_calls_it_never_had(tmp_path):
    placement, (two, three) = placed_when_the_broker_went(tmp_path)
    with started_again(tmp_path) as (client, agent):
        client.send(P.RESUME, {"ids": [2, 3]})
        register(agent, session=2, actors=[["a1", placement, 0, [], [two]]])
        assert calls(agent) == [three], "call 3 is not sent again (or call 2 is)"
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], "placed again"
        report(agent, 1, 2, [b"2", b"3"], held=[three],
               results=[[two, P.OK, 1, {}], [three, P.OK, 1, {}]])
        assert results(client) == {2: (P.OK, [b"2"]), 3: (P.OK, [b"3"])}, "(one report, one turn)"


@pytest.mark.parametrize("restarts", [0, 1])
def test_an_actor_its_agent_no_longer_has_restarts_or_dies(tmp_path, restarts):
    placement, (two, three) = placed_when_the_broker_went(tmp_path, restarts)
    with started_again(tmp_path) as (client, agent):
        client.send(P.RESUME, {"ids": [2, 3]})
        register(agent, session=2, actors=[])
        told = results(client, info=True)
        assert told[2][0] == P.FAILED and "no longer had it" in told[2][1]["message"], \
            "call 2, which may have run, is not failed (it has no retries)"
        if restarts:
            [(again, *_, opts)] = agent.take(P.ASSIGN).body["tasks"]
            assert again != placement and opts["actor"] == "a1", "not placed again"
            report(agent, 1, 2, [b"none"], held=[again], results=[[again, P.OK, 1, {}]])
            assert calls(agent) == [three], "call 3 does not go to the new instance"
        else:
            assert 3 in told or results(client, info=True)[3][0] == P.FAILED


def test_an_actor_whose_construction_its_agent_gives_back_is_placed_again(tmp_path):
    """Its construction waited for the broker that went (the broker keeps where it placed
    an actor before it sends it): it never began, and is placed again, no restart
    spent."""
    placement, _ = placed_when_the_broker_went(tmp_path, restarts=0, up=False)
    with started_again(tmp_path) as (client, agent):
        register(agent, session=2, actors=[], returned=[placement])
        [(again, *_, opts)] = agent.take(P.ASSIGN).body["tasks"]
        assert opts["actor"] == "a1", "given back, it was lost (no restarts: dead)"
        report(agent, 1, 2, [b"none"], held=[again], results=[[again, P.OK, 1, {}]])
        call(client, 2)
        assert len(calls(agent)) == 1, "the new instance takes no calls"


@pytest.mark.parametrize("carried", [True, False])
def test_an_actor_whose_construction_never_reached_its_agent_is_placed_again(tmp_path,
                                                                             carried):
    """The broker went right after sending a1's construction (kept before it was sent),
    which never arrived. An agent carrying the very session it was sent to offers every
    actor it may have begun: a1, not offered, never began there, and is placed again, no
    restart spent. One that began anew cannot say so: a1 may have begun there, and is
    lost (no restarts: dead). (A named actor made as the broker was killed died so.)"""
    placement, _ = placed_when_the_broker_went(tmp_path, restarts=0, up=False, held=False)
    with started_again(tmp_path) as (client, agent):
        client.send(P.RESUME, {"ids": [1]})
        register(agent, session=2, actors=[], **({"carried": 1} if carried else {}))
        if carried:
            [(again, *_, opts)] = agent.take(P.ASSIGN).body["tasks"]
            assert opts["actor"] == "a1", "not placed again"
            report(agent, 1, 2, [b"none"], held=[again], results=[[again, P.OK, 1, {}]])
            assert results(client)[1] == (P.OK, [b"none"])
            call(client, 2)
            assert len(calls(agent)) == 1, "the new instance takes no calls"
        else:
            outcome, info = results(client, info=True)[1]
            assert outcome == P.FAILED and info["type"] == "ActorDiedError", info
            assert not [m for m in agent.sync() if m.kind == P.ASSIGN]


def test_an_actor_that_began_is_never_placed_as_new_by_an_agent_carrying_the_session(
        tmp_path):
    """Not offered by an agent carrying the whole session, and yet begun: a1 was up (its
    process since killed, say by a kill sent just before the broker died), or b1's
    __init__ raised while the broker was away (its agent ended it and says how it ended).
    Neither is placed again: a1 is lost (no restarts: dead), b1 dies of its __init__'s
    error, as without the restart."""
    placement, (two, three) = placed_when_the_broker_went(tmp_path, restarts=0)
    with started_again(tmp_path) as (client, agent):
        client.send(P.RESUME, {"ids": [1, 2, 3]})
        register(agent, session=2, actors=[], carried=1)
        told = results(client, info=True)
        told.update(results(client, info=True) if len(told) < 2 else {})
        assert told[2][0] == P.FAILED and "no longer had it" in told[2][1]["message"], told
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], "a1 was placed again"
    state = tmp_path / "other"
    placement, _ = placed_when_the_broker_went(state, restarts=0, up=False)
    with started_again(state) as (client, agent):
        client.send(P.RESUME, {"ids": [1]})
        register(agent, session=2, actors=[], carried=1, frames=[b"boom"],
                 ended=[[placement, P.RAISED, 1, {"type": "ValueError"}]])
        outcome, frames = results(client)[1]
        assert (outcome, frames) == (P.RAISED, [b"boom"]), "not its __init__'s own error"
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], "its __init__ ran twice"


def test_an_actor_offered_back_without_room_is_lost_not_placed_as_never_begun(tmp_path):
    """Offered back by an agent carrying the whole session, on a slot too small for it
    now: it began there, so it is stopped and lost (no restarts: dead), never placed
    again as one whose construction never arrived."""
    placement, _ = placed_when_the_broker_went(tmp_path, restarts=0, up=False)
    with started_again(tmp_path) as (client, agent):
        client.send(P.RESUME, {"ids": [1]})
        agent.send(P.REGISTER, {"name": "node", "session": 2, "host": "h", "pid": 1,
                                "t": time.monotonic(), "jobs": [], "ended": [],
                                "carried": 1, "actors": [["a1", placement, 0, [], []]],
                                "slots": [{"units": {"CPU": UNIT}, "gpus": []}]})
        agent.take(P.WELCOME)
        told = agent.sync()
        assert [m.body["ids"] for m in told if m.kind == P.KILL_ACTOR] == [["a1"]]
        assert not [m for m in told if m.kind == P.ASSIGN], "placed again as never begun"
        outcome, info = results(client, info=True)[1]
        assert outcome == P.FAILED and info["type"] == "ActorDiedError", info


def test_a_construction_that_ended_unheard_is_told_with_the_offer(tmp_path):
    placement, _ = placed_when_the_broker_went(tmp_path, up=False)
    with started_again(tmp_path) as (client, agent):
        client.send(P.RESUME, {"ids": [1]})
        offer: dict[str, Any] = {"actors": [["a1", placement, 0, [], []]],
                                 "ended": [[placement, P.OK, 1, {}]], "frames": [b"none"]}
        register(agent, session=2, **offer)
        assert results(client)[1] == (P.OK, [b"none"]), "ready() is not told"
        call(client, 2)
        assert len(calls(agent)) == 1, "a call does not go to the actor taken back"


SPEC = {"id": "a1", "name": "", "cls": "C", "methods": ["m"], "restarts": 0}


def made_and_called(client: Peer, local: int) -> None:
    """The construction of a1 (local 1) and a call on it (LOCAL), in one submit: what a
    client sends again to a restarted broker when it had not heard the first accepted."""
    client.send(P.SUBMIT, {"tasks": [[1, {"foo": UNIT}, 0, 0, [], 2, "C", False,
                                      {"actor": SPEC}],
                                     [local, {}, 0, 0, [], 2, f"m{local}", False,
                                      {"call": "a1"}]]},
                [b"cls", b"args", b"m", b"args%d" % local])


@pytest.mark.parametrize("placed", [False, True], ids=["pending", "placed"])
@pytest.mark.parametrize("holds", [True, False], ids=["held", "let-go"])
def test_an_actor_sent_again_after_a_restart_is_the_actor_restored(tmp_path, placed, holds):
    """The broker went after writing a1's construction, before its client heard it
    accepted: the client sends it again, a call behind it, and the restarted broker, which
    restored a1, takes it as the same actor (made once, the call goes to it). It used to
    refuse the whole submit, `actor id a1 is already in use`, failing the call with it."""
    broker = broker_on(tmp_path)
    client, _ = hello(broker)
    agent = Peer(broker)
    create(client, restarts=0)
    placement = None
    if placed:
        register(agent, session=1)
        [(placement, *_)] = agent.take(P.ASSIGN).body["tasks"]
        report(agent, 1, 1, [b"none"], held=[placement], results=[[placement, P.OK, 1, {}]])
        assert results(client) == {1: (P.OK, [b"none"])}
    client.sync()  # (taken in, and written at the end of that turn; its accepted unheard)
    broker = restarted(broker, tmp_path, client, agent)
    client, _ = hello(broker)
    agent = Peer(broker)
    try:
        # (HOLDS: its ready future still held; else dropped, which a restarted broker
        # hears as the client's resume not naming it)
        client.send(P.RESUME, {"ids": [], "holds": [1] if holds else [], "last": True})
        made_and_called(client, 2)
        assert not [m for m in client.sync() if m.kind == P.REFUSED], "refused"
        offer = {"actors": [["a1", placement, 0, [], []]]} if placed else {}
        register(agent, session=2, **offer)
        if not placed:
            [(placement, *_)] = agent.take(P.ASSIGN).body["tasks"]
            report(agent, 1, 2, [b"none"], held=[placement],
                   results=[[placement, P.OK, 1, {}]])
        [call_id] = calls(agent)
        assert not [m for m in agent.sync() if m.kind == P.ASSIGN], "a1 made twice"
        report(agent, 1 if placed else 2, 2, [b"2"], held=[call_id],
               results=[[call_id, P.OK, 1, {}]])
        told: dict[int, Any] = {}
        while 2 not in told:  # (a1's construction, made again or not, may be told first)
            told.update(results(client, info=True))
        assert told[2][0] == P.OK, f"the call did not run on a1: {told[2]}"
        assert [a["id"] for a in client_status(client)["actors"]] == ["a1"]
    finally:
        for peer in (client, agent):
            peer.close()
        broker.close()


def client_status(client: Peer) -> dict[str, Any]:
    client.send(P.STATUS, {"req": 1})
    return client.take(P.STATUS_REPLY).body
