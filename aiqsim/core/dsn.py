"""Connection strings shown in messages without their secrets."""

from __future__ import annotations

import re

__all__ = ["redacted_dsn", "without_secrets"]

_PASSWORD_KEYWORD = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)")
"""A ``password=`` keyword of a ``key=value`` DSN or of a URL's query: (``password=``, its value)."""


def _url_parts(dsn: str) -> tuple[str, str, str] | None:
    """A URL DSN's (scheme, ``user:password`` part, host and the rest), if it has a password. The
    user part runs to the last ``@``: a password may hold an unencoded one (hiding more, not less)."""
    scheme, separator, rest = dsn.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not separator or not at or ":" not in userinfo:
        return None
    return scheme, userinfo, host


def redacted_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``, for messages: a ``password=`` keyword (of a
    ``key=value`` DSN or a URL's query) and the password of a URL's ``user:password@`` part."""
    text = _PASSWORD_KEYWORD.sub(r"\1***", dsn)
    parts = _url_parts(text)
    if parts is None:
        return text
    scheme, userinfo, host = parts
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def without_secrets(text: str, dsn: str) -> str:
    """``text`` (a driver's error message about ``dsn``) with the passwords ``dsn`` holds replaced by
    ``***``, and each ``@``-separated piece of them (libpq reads an unencoded ``@`` in a URL's password
    as the end of the user part and names the rest as the host)."""
    secrets = {match.group(2).strip("'") for match in _PASSWORD_KEYWORD.finditer(dsn)}
    parts = _url_parts(dsn)
    if parts is not None:
        password = parts[1].split(":", 1)[1]
        secrets.add(password)
        secrets.update(password.split("@"))
    for secret in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
