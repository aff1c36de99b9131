"""Locality in the pure scheduler (issue 29): a task goes where most of its inputs' bytes
are when it fits there now, and never waits for that agent."""

from __future__ import annotations

from tests.scheduler.test_scheduler import cap, placed, req
from zres.scheduler.policy import Scheduler


def test_a_task_goes_where_its_inputs_are_when_it_fits_there_and_never_waits_for_it():
    sched = Scheduler()
    sched.add_slot(1, "agent-a", cap(CPU=2))
    sched.add_slot(2, "agent-b", cap(CPU=4))  # (best fit alone would pick agent-a)
    sched.enqueue(1, req(), near=("agent-b",))
    sched.enqueue(2, req())
    assert placed(sched.schedule()) == {1: 2, 2: 1}
    for task in (3, 4, 5, 6):
        sched.enqueue(task, req(), near=("agent-b", "agent-a"))
    assert placed(sched.schedule()) == {3: 2, 4: 2, 5: 2, 6: 1}, \
        "a task waited for its inputs' agent while another had room"
