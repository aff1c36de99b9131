"""Pure placement policy: which waiting task runs on which worker slot, and why not.

No sockets, threads or clocks: the broker feeds events in (slot added, changed or removed,
task queued, task finished, the time) and calls ``Scheduler.schedule(now)`` for the grants
to send. Tested with plain data and a fake clock (``tests/scheduler/``), and simulated at
scale in one process (``bench/simulate.py``).

Modules: ``policy`` (the Scheduler: passes, reservations, slot queues), ``table`` (every
slot's capacity and free amounts, each agent's slots), ``queue`` (waiting tasks by owner
and shape), ``owners`` (fair share: each owner's holdings, decaying use and quota),
``order`` (the order a pass takes waiting tasks in),
``records`` (Slot, Waiting, Grant, Workers), ``devices`` (GPUs per device, and whether a
request could ever fit), ``index`` (slots sorted by room), ``fit`` (the best slot for a
task now), ``durations`` (how long each kind of task takes, for pipelining and backfill),
``reservations`` (where a starving task reserves, and what that keeps from later tasks),
``pipelining`` (which slot's queue a blocked task joins), ``explain`` (why a task waits,
in words); ``reserving`` (the reservations the scheduler makes and ends); ``gangs``,
``gang_fit`` and ``ganging`` (gangs: bundles on several slots reserved all at once, and the
tasks placed inside them).

Rules
- Order: owners by fair share, least charge first (``owners``: recent use, decaying with a
  half-life, plus what they hold now; an owner moves back with every grant); within one
  owner's work, higher priority first, equal priority in submission order (``seq``). Ties
  never depend on dict or set order, so the same events always give the same schedule.
  Work-conserving: a task of any owner that fits is placed; nothing idles to be fair.
- Quotas: an owner's work holds at most its quota (``Quotas``), counted from grant to
  release; a task that would take it over waits (its lane skipped for the pass), reserves
  nothing, and others' tasks pass it.
- Backfill: a task that cannot start is skipped, never blocking later tasks that can.
  Waiting tasks are indexed by the *shape* of their request (its amounts, and the agents
  it may run on): all tasks of one shape fit or fail alike, so one failed fit blocks a
  whole shape for the pass.
- Agents by name (``workers=``): a task restricted to some agents is placed only on their
  slots, and is infeasible (saying which agents it may run on) when none of them could
  ever run it, or none has joined; one that only prefers them (``allow_other_workers``)
  takes one of theirs when it fits now, else any slot. A task with no such restriction
  pays nothing for it.
- Fit is checked against each slot's *free* amounts, subtracted at grant and returned at
  release; concurrent grants never exceed any slot's capacity.
- No starvation: a task that has been blocked for ``starvation_after`` seconds (counted
  from the first pass that found it blocked, not from when it was queued: a task behind a
  long queue that moves is not starving) gets a reservation on the slot where it will fit
  soonest (the least still to be freed). From then on, in every pass, a task ordered after
  it may start on that slot only if it cannot delay it (see ``reservations``): it takes
  nothing of what the holder is short of, and of the rest leaves what the holder will
  need once the tasks that must end first have given theirs back; or it is expected to
  end before the holder could start (EASY backfill, from ``durations``). The holder starts
  as soon as the tasks running there that hold what it lacks finish. Its owner's tasks
  ordered before it (higher priority) are not fenced; other owners' tasks are, wherever
  fair share puts them in the pass. Tasks of one shape wait in order: a later task of
  a shorter kind does not pass a head that cannot backfill.
- GPUs are accounted per device: GPU=k (whole) takes k devices that are wholly free,
  with all their memory; a fraction below 1 packs onto the busiest device with room,
  never spanning two. GPU_MEMORY=m takes m bytes on one device (with the fraction, if
  both are asked), packing onto the device with least memory left that fits.
- Among slots that fit, prefer the one that strands least: fewest resource kinds the task
  does not use (keep GPU nodes for GPU work), then least left over, then slot id.
- Cost: each decision looks up candidates in a per-resource index of slots sorted by room
  (free less what queued grants will take: slots whose room is promised to their queues
  are never walked), examining at most a few fitting slots; passes touch one head per
  shape. A blocked shape probes only the slots that gained room since, each at most once
  a pass (one that does not fit is dropped from the shape's list). Choosing a queue walks
  a shape's candidate slots, kept as slots gain room or a queue place (``pipelining``),
  never every slot that could run it. So a decision costs about the same at 1,000 agents
  as at 100 (``bench/simulate.py``).
- Pipelining (``prefetch`` > 0): a *short* task that fits nowhere now may be granted to a
  slot whose capacity could run it, into that slot's queue of at most ``prefetch`` grants,
  if what it needs there is free or held by short tasks (never behind long work, nor
  behind an actor or a job, whose hold may never end: it is never short work). The
  agent starts queued grants itself as room frees (priority first, backfilling, see
  ``zres.agent.running``) and reports each start; ``started(task)`` takes its resources
  then: the scheduler never predicts a start. A task that fits a slot with a queue is
  granted there at once only if it leaves room for everything queued there, so the
  agent's own starts and the broker's grants can never overlap beyond capacity. Only tasks
  without GPU or GPU_MEMORY, and not actors or jobs, are queued; a slot reserved for a
  starving task, or one an earlier blocked task could use, takes none. Only tasks of a
  *kind* (the caller's label, e.g. the function) whose recent runs took under
  ``SHORT_TASK`` are queued, and a task of a kind never seen is taken to be long. One of a
  short kind that runs ``LONG_AFTER`` is taken to be long, and ``overdue`` names the grants
  queued behind it that another slot could run, for the broker to ask back
  (``stragglers``).
- Gangs (placement groups, multi-node jobs): several bundles, each a request for one slot,
  placed all at once by a strategy (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD) or not at
  all: nothing is held until every bundle fits, so two gangs never deadlock on halves. A
  gang waits in the queue like a task (fair share, priority, its owner's quota for all its
  bundles), reserves a slot per bundle once it starves, and is infeasible when no agents
  could ever hold it. A task placed inside a bundle draws on that bundle alone, waits for
  its gang and for room in its bundle, and is charged nothing (its gang holds it). A slot
  holding a bundle takes no queued grants. A gang that did not fit is tried again only
  once a slot has gained room (or a fence was in its way), and only after the index says
  enough slots have room for its bundles: a waiting gang costs a pass O(log n).
- Closed slots (an agent draining, or whose connection closed) take no new grant; what
  runs there is not disturbed.
"""
