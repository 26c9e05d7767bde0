"""Who may scrape /metrics: the decision alone, pure (the view hands it the request's facts).

- a token is configured (KOALA_METRICS_TOKEN or KOALA_METRICS_TOKEN_FILE): ``Authorization:
  Bearer <token>`` compared in constant time → 200; anything else → 401, which says nothing about
  why (a missing header, a wrong token and a wrong scheme read the same);
- no token configured: loopback clients only (127.0.0.0/8, ::1, an IPv4-mapped loopback) → 200,
  any other → 403. A proxy in front makes every client look local: configure a token then.
"""

from __future__ import annotations

import hmac
import ipaddress
from enum import IntEnum


class Verdict(IntEnum):
    ALLOWED = 200
    UNAUTHORIZED = 401
    FORBIDDEN = 403


def _loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def decide(*, token: str, authorization: str, remote_addr: str) -> Verdict:
    if token:
        scheme, _, given = authorization.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
        return Verdict.ALLOWED if ok else Verdict.UNAUTHORIZED
    return Verdict.ALLOWED if _loopback(remote_addr) else Verdict.FORBIDDEN
