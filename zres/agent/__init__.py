"""The node agent (``zres agent``): one per node, and the processes that run its work.

``daemon`` holds the link to the broker and routes its messages; ``slots`` works out what
the node offers; ``running`` runs granted tasks on the slots and starts queued grants as
room frees; ``actors`` supervises actor processes; ``workers`` starts and stops the worker
processes; ``worker`` is the task process itself (``python -m zres.agent.worker``);
``commands`` runs command jobs; ``gpu`` discovers GPUs through NVML.
"""
