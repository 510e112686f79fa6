"""The runtime (anyio drivers): pool, router, queue, GPU arbiter, health gate, prompt cache.

Each driver executes what a pure policy in :mod:`hostler.policies` decides and records the
decision, with its inputs, as an event; :class:`hostler.Runtime` is the facade over them.
"""
