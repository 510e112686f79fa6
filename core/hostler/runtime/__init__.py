"""The runtime: the anyio drivers, and the :class:`hostler.Runtime` facade over them.

The drivers: pool, router, request queue, GPU arbiter, device health gate, prompt-cache
controller.

Each driver executes what a pure policy in :mod:`hostler.policies` decides and records the
decision, with its inputs, as an event.
"""
