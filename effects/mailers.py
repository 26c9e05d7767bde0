"""The mailer used when EMAIL_HOST is unset (development): nothing is delivered.

Each message is one INFO line on the ``koala.mail`` logger (subject, recipient count, Message-ID)
and the whole message at DEBUG, both through Koala's redacting log handler. Django's console
backend printed the whole message to stdout instead: about twenty lines per email, unmasked.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.mail.backends.console import EmailBackend

log = logging.getLogger("koala.mail")


class LoggingEmailBackend(EmailBackend):
    def write_message(self, message: Any) -> None:
        recipients = len(message.recipients())
        log.info(
            "email %r to %d recipient%s not delivered (no EMAIL_HOST; LOG_LEVEL=DEBUG logs the message), Message-ID %s",
            message.subject,
            recipients,
            "" if recipients == 1 else "s",
            message.extra_headers.get("Message-ID", "-"),
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("email message:\n%s", message.message().as_string())
