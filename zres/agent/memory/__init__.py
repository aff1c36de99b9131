"""What a task asks for is what it gets (issue 30): memory limits, enforced.

A task, actor or command job that asked ``MEMORY=m`` runs in a process tree of its own,
limited to m: by the kernel where the agent can make cgroups (``cgroups``: v2, or v1's
memory controller), else by a watcher that samples the tree's resident memory and kills it
past the limit (``procs``, ``monitor``). ``monitor`` also watches the node: when its
available memory falls below the reserve, ``guard`` stops taking work and stops the most
recently started task of the lowest priority.
"""
