"""The broker and an agent stepped in one thread, with no processes: capacity changes."""

from __future__ import annotations

from zres.agent.slots import plan_slots
from zres.core.resources import UNIT, parse_spec


def test_a_lowered_gpu_count_survives_re_registration():
    """Broker and agent stepped in one thread: lower GPU, re-register, raise it again."""
    import time

    import zmq

    from zres.agent.daemon import Agent
    from zres.broker.server import Broker
    from zres.core import protocol as P

    broker = Broker("tcp://127.0.0.1:0")
    agent = Agent(broker.address, plan_slots(parse_spec("GPU=2"), 1, 2, detect=False),
                  name="node")
    admin = zmq.Context.instance().socket(zmq.DEALER)
    admin.connect(broker.address)

    def step_until(condition, what):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, what
            broker.poll_once(time.monotonic(), timeout=0.01)
            agent.poll_once(time.monotonic(), timeout=0.01)

    def change(gpus: int) -> dict:  # type: ignore[type-arg]
        admin.send_multipart(P.encode(P.RESOURCES, {"agent": "node",
                                                    "units": {"GPU": gpus * UNIT}}))
        step_until(lambda: admin.poll(0), "a reply to the capacity change")
        return P.decode(admin.recv_multipart()).body

    try:
        step_until(lambda: agent.session.registered, "registration")
        assert "error" not in change(1)
        step_until(lambda: agent.slots[0].units["GPU"] == UNIT, "the agent to learn it")
        agent.session.registered = False
        agent._register(time.monotonic())  # as after a broker restart or a silence
        step_until(lambda: agent.session.registered, "re-registration")
        (record,) = broker.agents.by_ident.values()
        assert broker.sched.slots[record.slots[0]].total["GPU"] == UNIT
        assert "error" not in change(2)
    finally:
        admin.close(0)
        agent.shutdown()
        broker.close()
