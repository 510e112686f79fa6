"""Pure policies: decisions from state and observations, each returned with its inputs."""

from __future__ import annotations
