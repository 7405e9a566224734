"""Start-up refusals of the engine adapters: one line saying why the adapter cannot serve the
engine's configuration and what to change. The engine fails to start with it, rather than run
with a cache that could serve wrong state."""

from __future__ import annotations


class StartupRefused(ValueError):
    """An adapter cannot serve this configuration: one line says why and what to change."""


def refuse(adapter: str, why: str, change: str) -> StartupRefused:
    return StartupRefused(f"{adapter}: {why}; {change}")
