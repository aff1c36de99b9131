"""The shared vocabulary of every zres process, with no sockets of its own.

``protocol`` (the wire format), ``resources`` (amounts: parse, validate, exact fixed-point
arithmetic), ``tasks`` (the task record and its legal transitions), ``errors``,
``serialize`` (payloads: calls, results and exceptions, for clients and workers only) and
``context`` (the running task's context).
"""
