"""Stand-ins for the outside world that run for real on loopback, shared by ``make run`` and the tests.

``provider``: a payment provider and a priced model API (``python -m devtools.sandbox.provider``).
The test-only fakes (SMTP sink, TCP fault proxy) stay in tests/fakes/.
"""
