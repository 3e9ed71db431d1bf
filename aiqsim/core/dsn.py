"""Connection strings shown in messages without their secrets."""

from __future__ import annotations

import re

__all__ = ["redacted_dsn", "without_secrets"]


def redacted_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``, for messages: a ``password=`` keyword (of a
    ``key=value`` DSN or a URL's query) and the password of a URL's ``user:password@`` part, which may
    itself hold an ``@`` (everything up to the last ``@`` is taken as the user part, hiding more
    rather than less)."""
    text = re.sub(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", r"\1***", dsn)
    scheme, separator, rest = text.partition("://")
    if not separator:
        return text
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return text
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def without_secrets(text: str, dsn: str) -> str:
    """``text`` (a driver's error message about ``dsn``) with the passwords ``dsn`` holds replaced by
    ``***``, and each ``@``-separated piece of them (libpq reads an unencoded ``@`` in a URL's password
    as the end of the user part and names the rest as the host)."""
    secrets: set[str] = set()
    for match in re.finditer(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]*)", dsn):
        secrets.add(match.group(1).strip("'"))
    _scheme, separator, rest = dsn.partition("://")
    userinfo, at, _host = rest.rpartition("@")
    if separator and at and ":" in userinfo:
        password = userinfo.split(":", 1)[1]
        secrets.add(password)
        secrets.update(password.split("@"))
    for secret in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
