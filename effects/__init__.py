"""Side effects on the outside world: provider clients (providers/) and the built-in kinds that use them.

No models: every effect is recorded by the engine's operations ledger (workers); this app only
says what to send and how to look it up again (docs/effects.md).
"""
