"""Email through Django's default mailer (``MAILERS["default"]``: SMTP when ``EMAIL_HOST`` is
set, else logged and not delivered: effects/mailers.py), one message per operation key.

The Message-ID is derived from the operation key, so every send of one operation carries the
same Message-ID (and the key itself in ``X-Koala-Idempotency-Key``): a receiving system that
deduplicates by Message-ID sees one message.

SMTP has no way to ask a server "did you accept the message with this id?", so there is no
sound reconcile for email: a send whose outcome is unknown (the connection dropped or timed
out after the message data went out) cannot be checked by Koala. The email kind therefore
hands such an operation to a person (needs attention) rather than guessing; docs/effects.md
explains the at-least-once caveat of SMTP.

Error classes by how far the SMTP conversation got:
- connect, TLS, greeting or login failed: nothing was sent → ``NotPerformed`` (bad
  credentials → ``Declined``: retrying cannot fix them);
- sender or recipients refused, or the message data answered with an error code: the server
  did not take the message → 4xx ``NotPerformed``, 5xx ``Declined``;
- the connection broke or timed out during the transaction → ``OutcomeUnknown``.
"""

from __future__ import annotations

import hashlib
import logging
import smtplib
from typing import Any

from django.conf import settings
from django.core import mail
from django.core.mail import EmailMessage

from koala import redaction
from workers import Declined, NotPerformed, OutcomeUnknown

IDEMPOTENCY_HEADER = "X-Koala-Idempotency-Key"

log = logging.getLogger("koala.providers")


def message_id(key: str) -> str:
    """A Message-ID that is the same for every send of one operation key."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:40]
    domain = settings.KOALA_EMAIL_MESSAGE_ID_DOMAIN
    return f"<koala.{digest}@{domain}>"


def send(*, key: str, to: list[str], subject: str, body: str, from_email: str = "") -> dict[str, Any]:
    """Send one message; returns a summary (Message-ID, recipients count) for the ledger."""
    try:
        return _send(key=key, to=to, subject=subject, body=body, from_email=from_email)
    except (NotPerformed, OutcomeUnknown, Declined) as exc:
        # Masked before it is logged: the server's reply may echo recipients or the message.
        log.warning("%s (%s)", redaction.current().text(str(exc)), type(exc).__name__)
        raise


def _send(*, key: str, to: list[str], subject: str, body: str, from_email: str) -> dict[str, Any]:
    mid = message_id(key)
    message = EmailMessage(
        subject=subject,
        body=body,
        from_email=from_email or settings.DEFAULT_FROM_EMAIL,
        to=to,
        headers={"Message-ID": mid, IDEMPOTENCY_HEADER: key},
    )
    backend = mail.mailers.default
    try:
        backend.open()
    except smtplib.SMTPAuthenticationError as exc:
        raise Declined(f"email: the SMTP server refused our login (code {exc.smtp_code})") from None
    except (OSError, smtplib.SMTPException) as exc:
        raise NotPerformed(f"email: could not open the SMTP session ({type(exc).__name__}); nothing was sent") from None
    try:
        sent = backend.send_messages([message])
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        refused = f"email: every recipient was refused (codes {sorted(set(codes))})"
        if any(code >= 500 for code in codes):
            raise Declined(refused) from None
        raise NotPerformed(refused) from None
    except (smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as exc:
        what = "sender" if isinstance(exc, smtplib.SMTPSenderRefused) else "message"
        refused = f"email: the SMTP server refused the {what} (code {exc.smtp_code})"
        if exc.smtp_code >= 500:
            raise Declined(refused) from None
        raise NotPerformed(refused) from None
    except (OSError, smtplib.SMTPException) as exc:
        # SMTPServerDisconnected, timeouts, resets: the data may have been accepted already.
        raise OutcomeUnknown(
            f"email: the SMTP session broke ({type(exc).__name__}) during the transaction; the message may have been delivered"
        ) from None
    finally:
        try:
            backend.close()
        except (OSError, smtplib.SMTPException):
            pass  # the transaction's outcome is decided above; a failed QUIT changes nothing
    if sent != 1:
        raise NotPerformed("email: the mailer reported no message sent")
    return {"message_id": mid, "recipients": len(to)}
