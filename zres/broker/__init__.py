"""The broker process (``zres broker``): one per cluster, the one source of truth.

``server`` holds the ROUTER socket and routes each message to the part that owns what it
is about: ``graph`` (tasks, dependencies, results), ``clients``, ``agents`` (registrations,
slots), ``beats`` (heartbeats), ``dispatch`` (tasks to agents and outcomes back, losses and
retries), ``actors``, ``jobs`` (command jobs: their records in ``job_records``, the environments
they export kept once in ``job_envs``), ``status`` (why a task waits; the cluster's status)
and ``submit`` (reading a SUBMIT); ``auth`` and ``identity`` say who may send what, acting
for whom. Placement itself is the pure ``zres.scheduler``. The
broker never unpickles user data.
"""
