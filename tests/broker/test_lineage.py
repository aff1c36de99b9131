"""Lineage over a real task graph, stepped by hand (no processes): a result whose task was
made again and failed is lost for good, and nothing waits for it to be made; an actor's
call never goes with an input lost since it was ready."""

from __future__ import annotations

from typing import Any

from zres.broker.graph import TaskGraph
from zres.broker.lineage import Lineage
from zres.core import protocol as P
from zres.core.tasks import Task, TaskState


class Queue:
    """The scheduler's queue, as lineage sees it."""

    def __init__(self) -> None:
        self.queued: list[int] = []

    def dequeue(self, task_id: int) -> bool:
        self.queued.remove(task_id)
        return True


def setup() -> tuple[TaskGraph, Lineage, Queue]:
    queue = Queue()

    def ready(task: Task) -> None:
        graph.set_state(task, TaskState.QUEUED)
        queue.queued.append(task.id)

    graph = TaskGraph(on_ready=ready, on_recorded=lambda task: None)
    lineage = Lineage(graph, queue,  # type: ignore[arg-type]
                      lambda task: queue.queued.append(task.id), lambda task: None)
    return graph, lineage, queue


def submit(graph: TaskGraph, task_id: int, deps: list[int], retries: int = 1) -> Task:
    task = Task(task_id, b"client", task_id, {}, 0, retries, f"t{task_id}", False, [b"call"],
                ())
    graph.add(task)
    graph.link(task, deps)
    return task


def run(graph: TaskGraph, queue: Queue, task: Task, size: int = 0) -> None:
    """TASK (queued) is granted and ends well, its result of SIZE bytes kept on agent-a."""
    queue.queued.remove(task.id)
    graph.set_state(task, TaskState.RUNNING)
    task.size, task.held_at = size, ["agent-a"] if size else ()
    graph.finish(task, P.OK, [], {"agent": "agent-a"})


def lost_on_its_remake(graph: TaskGraph, lineage: Lineage, queue: Queue, task: Task) -> None:
    """TASK's result is lost; made again, its agent is lost while it runs, no retries
    left."""
    task.held_at = ()
    lineage.lost([task], "agent agent-a (killed)")
    assert task.state is TaskState.QUEUED and task.retries == 0
    queue.queued.remove(task.id)
    graph.set_state(task, TaskState.RUNNING)
    graph.fail(task, "AgentLostError", f"agent agent-c was lost while running task "
               f"{task.name}, and it had no retries left")


def test_a_result_lost_after_its_input_was_made_again_and_failed_is_lost_for_good() -> None:
    graph, lineage, queue = setup()
    first = submit(graph, 1, [])
    run(graph, queue, first, size=100)
    second = submit(graph, 2, [1])  # (it holds FIRST: it may run again)
    run(graph, queue, second, size=100)
    lost_on_its_remake(graph, lineage, queue, first)
    assert first.state is TaskState.FAILED and second.state is TaskState.DONE
    second.held_at = ()
    lineage.lost([second], "agent agent-b (killed)")
    assert second.state is not TaskState.WAITING, "it waits for an input never to be made"
    assert "t2 was lost with agent agent-b" in second.lost
    assert "t1 was lost with its agent, and when it ran again it failed: agent agent-c " \
        "was lost" in second.lost
    assert second.retries == 1, "a retry was spent on a run that never came"


def test_a_task_that_could_not_read_an_input_which_was_made_again_and_failed_fails() -> None:
    graph, lineage, queue = setup()
    first = submit(graph, 1, [])
    run(graph, queue, first, size=100)
    reader = submit(graph, 2, [1])
    queue.queued.remove(reader.id)
    graph.set_state(reader, TaskState.RUNNING)  # (its worker fetches FIRST from agent-a)
    lost_on_its_remake(graph, lineage, queue, first)
    again: list[Any] = []
    lineage.input_lost(reader, {"input": 1}, again.append)
    assert reader.state is TaskState.FAILED and not again, "it waits for an input never made"
    assert reader.info["type"] == "ResultLostError"
    assert "when it ran again it failed" in reader.info["message"]


def test_a_task_going_again_waits_for_an_input_being_made_and_fails_if_it_failed() -> None:
    graph, lineage, queue = setup()
    first = submit(graph, 1, [], retries=2)
    run(graph, queue, first, size=100)
    reader = submit(graph, 2, [1])
    queue.queued.remove(reader.id)
    graph.set_state(reader, TaskState.RUNNING)
    first.held_at = ()
    lineage.lost([first], "agent agent-a (killed)")  # (made again: queued)
    assert lineage.waits_again(reader), "it would go with no input"
    assert reader.state is TaskState.WAITING and reader.missing == 1
    run(graph, queue, first, size=100)
    assert reader.state is TaskState.QUEUED and reader.missing == 0, "the input came"
    queue.queued.remove(reader.id)
    graph.set_state(reader, TaskState.RUNNING)
    lost_on_its_remake(graph, lineage, queue, first)
    assert lineage.waits_again(reader)
    assert reader.state is TaskState.FAILED and reader.info["type"] == "ResultLostError"


def actor_setup() -> tuple[TaskGraph, Lineage, Queue, Any, list[Any]]:
    """A graph whose ready actor calls queue for actor a1 (alive, on agent-z)."""
    from collections import deque

    from zres.broker.actor_records import ActorRecord, ActorState
    from zres.broker.actors import ActorRouting
    queue = Queue()
    sent: list[Any] = []

    def ready(task: Task) -> None:
        if task.actor:
            routing.call_ready(task)
        else:
            graph.set_state(task, TaskState.QUEUED)
            queue.queued.append(task.id)

    graph = TaskGraph(on_ready=ready, on_recorded=lambda task: None)
    graph.refer = lambda task: {"at": list(task.held_at)}  # (objects.ref: where it is)
    lineage = Lineage(graph, queue,  # type: ignore[arg-type]
                      lambda task: queue.queued.append(task.id), lambda task: None)
    routing = ActorRouting(lambda ident, kind, body=None, frames=(): sent.append(body),
                           graph, None, release=lambda task_id: None,  # type: ignore[arg-type]
                           waits=lineage.waits_again)
    actor = ActorRecord("a1", "", "C", ["f"], b"client", {}, 0, 0, 1, 0,
                        state=ActorState.ALIVE, agent=b"agent-z", agent_name="agent-z")
    actor.queues[b"client"] = deque()
    routing.actors["a1"] = actor
    return graph, lineage, queue, routing, sent


def call(graph: TaskGraph, routing: Any, task_id: int, deps: list[int]) -> Task:
    task = Task(task_id, b"client", task_id, {}, 0, 0, f"call{task_id}", False, [b"call"],
                ())
    task.actor = "a1"
    routing.actors["a1"].queues[b"client"].append(task_id)
    graph.add(task)
    graph.link(task, deps)
    return task


def test_an_actor_call_whose_input_was_lost_waits_for_it_and_goes_after() -> None:
    """An actor's call (ready, queued for the actor: sent again after it restarted, say)
    whose input's holder was lost meanwhile must not go with no input: it waits for the
    input to be made again, the caller's later calls wait behind it, then both go."""
    graph, lineage, queue, routing, sent = actor_setup()
    made = submit(graph, 1, [], retries=1)
    run(graph, queue, made, size=100)
    first, second = call(graph, routing, 2, [1]), call(graph, routing, 3, [])
    assert first.state is TaskState.QUEUED and second.state is TaskState.QUEUED
    made.held_at = ()
    lineage.lost([made], "agent agent-a (killed)")  # (made again: queued)
    routing.pump_all()
    assert sent == [], "a call went with an input that is being made again"
    assert first.state is TaskState.WAITING and second.state is TaskState.QUEUED
    run(graph, queue, made, size=100)  # (made again, on agent-a)
    routing.pump_all()
    [body] = sent
    assert [item[0] for item in body["calls"]] == [2, 3], "in the order made"
    assert body["calls"][0][4]["refs"] == {0: {"at": ["agent-a"]}}


def test_an_actor_call_whose_input_is_lost_for_good_fails_and_the_next_goes() -> None:
    graph, lineage, queue, routing, sent = actor_setup()
    made = submit(graph, 1, [], retries=0)
    run(graph, queue, made, size=100)
    first = call(graph, routing, 2, [1])
    call(graph, routing, 3, [])
    graph.set_state(first, TaskState.RUNNING)  # (sent: in flight when its actor restarted)
    made.held_at = ()
    lineage.lost([made], "agent agent-a (killed)")  # (retries=0: lost for good)
    graph.set_state(first, TaskState.QUEUED)  # (the restarted actor takes it again)
    routing.wake(routing.actors["a1"])
    routing.pump_all()
    assert first.state is TaskState.FAILED and first.info["type"] == "ResultLostError"
    assert "may not run again" in first.info["message"]
    [body] = sent
    assert [item[0] for item in body["calls"]] == [3]


def test_a_task_whose_inputs_holders_are_away_waits_for_them_not_granted_again_and_again(
        ) -> None:
    """After a broker restart a result's holders are known by name only until they come
    back: a task granted meanwhile could not read its input and was queued again at once,
    its worker failing again, both cores busy for the whole grace period. It waits for a
    holder to come back, or for the input's loss (made again: then after it)."""
    graph, lineage, queue = setup()
    away = {"agent-a", "agent-b"}
    graph.refer = lambda task: None if set(task.held_at) <= away else list(task.held_at)
    first, second = submit(graph, 1, []), submit(graph, 2, [])
    run(graph, queue, first, size=100)
    run(graph, queue, second, size=100)
    second.held_at = ["agent-b"]
    readers = [submit(graph, 3, [1]), submit(graph, 4, [2])]
    again: list[Any] = []
    for reader in readers:
        queue.queued.remove(reader.id)
        graph.set_state(reader, TaskState.RUNNING)
        lineage.input_lost(reader, {"input": reader.deps[0]}, again.append)
    assert not again, "granted again while its input's holders are away"
    assert all(r.state is TaskState.WAITING and r.missing == 1 for r in readers)
    away.discard("agent-a")  # (back, with the first input)
    lineage.holders_back()
    assert readers[0].state is TaskState.QUEUED and readers[0].missing == 0
    assert readers[1].state is TaskState.WAITING
    second.held_at = ()  # (agent-b did not come back: made again, it has a retry)
    lineage.lost([second], "agent agent-b (it did not come back)")
    assert second.state is TaskState.QUEUED and readers[1].missing == 1
    run(graph, queue, second, size=100)
    assert readers[1].state is TaskState.QUEUED and readers[1].missing == 0
