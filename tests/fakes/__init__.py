"""Real stand-ins for the outside world (a payment provider, a priced model API, an SMTP server).

They run real servers on loopback so Koala's provider clients exercise their real code path
(sockets, timeouts, status codes, headers). They are fakes of the outside world only: nothing
here replaces Koala's own code.
"""
