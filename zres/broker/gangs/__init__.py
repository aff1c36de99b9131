"""Gangs on the broker: resources on several agents held together.

``records`` (a placement group's record and states, the specs clients send), ``groups``
(placement groups: made, reserved, taken apart, their bundles lost), ``ranks`` (multi-node
command jobs: one job, a rank on each of N agents, started together, ended together), and
``keeping`` (what a broker restart keeps of them). The placement itself is the pure
scheduler's (``zres.scheduler.gangs``).
"""
