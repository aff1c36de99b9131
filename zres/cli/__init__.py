"""The ``zres`` command line: argument parsing only; the work lives in the packages it
calls. ``main`` (the parser and exit codes), ``cluster`` (broker, agent, status,
resources, demo), ``jobs`` (command jobs), ``options`` (what the commands share).
"""
