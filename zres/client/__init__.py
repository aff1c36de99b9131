"""The client side, in the user's process: ``client`` (the Client), ``io`` (its I/O thread,
the one owner of its socket), ``futures``, ``actors`` (actor handles), ``annotations``
(``zres.annotate``) and ``registry`` (the default client).
"""
