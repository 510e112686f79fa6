"""Tools for testing hostler and its plugins.

- :mod:`hostler.testing.tiny_gguf`: tiny real GGUF models that ``llama-server`` loads.
- :mod:`hostler.testing.tiny_mlx`: tiny real MLX model folders that ``mlx_lm.server`` loads.
- :mod:`hostler.testing.fake_engine`: a real engine process with scriptable misbehaviour.
- :mod:`hostler.testing.clock`: ``FakeClock`` (a pinned wall) and ``VirtualClock`` (all time).
- :mod:`hostler.testing.harness`: a data directory's log, ledger, supervisors and runtime.
- :mod:`hostler.testing.pytest_plugin`: fixtures, opt-in (``pytest_plugins = [...]``).
- :mod:`hostler.testing.conformance`: the adapter conformance suite (docs/testing.md).
"""

from __future__ import annotations

import sys

if "pytest" in sys.modules:  # under pytest: the suite's asserts say what they compared
    sys.modules["pytest"].register_assert_rewrite("hostler.testing.conformance")  # and its modules
