"""Clients for the outside world that job kinds call through ``ctx.operation``.

Each maps what it learns from a failed call onto the ledger's error classes
(``workers.errors``): ``NotPerformed`` when nothing reached the provider, ``OutcomeUnknown``
when the request went out and no usable answer came back, ``Declined`` when the provider
said no. Only that distinction tells Koala whether re-sending is safe.
"""
