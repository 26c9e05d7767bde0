"""Real stand-ins for the outside world that only the tests need (an SMTP server, a TCP fault proxy).

They run real servers on loopback so Koala's clients exercise their real code path (sockets,
timeouts, status codes, headers). They are fakes of the outside world only: nothing here replaces
Koala's own code. The payment/model provider lives in devtools/sandbox/provider.py, because
``make run`` starts it too: the tests and the demo share one outside world.
"""
