"""``hostler serve``: the HTTP face over :class:`hostler.Runtime` (docs/serve.md).

An OpenAI-compatible proxy that loads models on demand, and the operator API.
"""
