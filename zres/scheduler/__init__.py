"""Pure placement policy: which waiting task runs on which worker slot, and why not.

No sockets, threads or clocks: the broker feeds events in (slot added, changed or removed,
task queued, task finished, the time) and calls ``Scheduler.schedule(now)`` for the grants
to send. Tested with plain data and a fake clock (``tests/scheduler/``), and simulated at
scale in one process (``bench/simulate.py``).

Modules: ``policy`` (the Scheduler: table, queue, passes, reservations, slot queues),
``records`` (Slot, Waiting, Grant), ``devices`` (GPUs per device, and whether a request
could ever fit), ``index`` (slots sorted by free amount), ``durations`` (how long each kind
of task takes, for pipelining), ``explain`` (why a task waits, in words).

Rules
- Order: higher priority first; equal priority in submission order (``seq``). Ties never
  depend on dict or set order, so the same events always give the same schedule.
- Backfill: a task that cannot start is skipped, never blocking later tasks that can.
  Waiting tasks are indexed by the *shape* of their request: all tasks of one shape fit
  or fail alike, so one failed fit blocks a whole shape for the pass.
- Fit is checked against each slot's *free* amounts, subtracted at grant and returned at
  release; concurrent grants never exceed any slot's capacity.
- No starvation: a task that has waited ``starvation_after`` seconds while blocked gets a
  reservation on the slot where it will fit soonest (the least still to be freed). From
  then on, in every pass, tasks ordered after it may take from that slot only what
  leaves its whole request free; it starts as soon as the tasks running there finish.
  Tasks ordered before it (higher priority) are not fenced.
- GPUs are accounted per device: GPU=k (whole) takes k devices that are wholly free,
  with all their memory; a fraction below 1 packs onto the busiest device with room,
  never spanning two. GPU_MEMORY=m takes m bytes on one device (with the fraction, if
  both are asked), packing onto the device with least memory left that fits.
- Among slots that fit, prefer the one that strands least: fewest resource kinds the task
  does not use (keep GPU nodes for GPU work), then least left over, then slot id.
- Cost: each decision looks up candidates in a per-resource index of slots sorted by free
  amount (bisect), examining at most a few fitting slots; passes touch one head per shape.
- Pipelining (``prefetch`` > 0): a *short* task that fits nowhere now may be granted to
  a slot whose capacity could run it, into that slot's queue of at most ``prefetch`` grants; it
  starts when room frees there. Queued grants start strictly in order, each when it fits
  the slot's free amounts: the agent applies the same rule to the same grants and the
  same completions, so both sides agree on what runs, and the agent never starts more
  than its capacity. A slot with a queue takes no immediate grant (it would overtake).
  Only tasks without GPU or GPU_MEMORY, and not actors, are queued; a slot reserved for
  a starving task, or one an earlier blocked task could use, takes none. This hides the
  broker round trip between one task's end and the next one's start. The price: work that
  would fit a slot now waits while that slot has a queue, and a queued grant waits for
  room there even if another slot frees first. So only tasks of a *kind* (the caller's
  label, e.g. the function) whose recent runs took under ``SHORT_TASK`` are queued: the
  wait a queue can cause stays a few milliseconds, and long work is never held back. A
  task with no kind is taken to be short.
"""
