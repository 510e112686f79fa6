"""The runtime (anyio drivers): pool, router, request queue, GPU arbiter, device health gate,
prompt-cache controller, and the :class:`hostler.Runtime` facade over them.

Each driver executes what a pure policy in :mod:`hostler.policies` decides and records the
decision, with its inputs, as an event.
"""
