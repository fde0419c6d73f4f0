"""A store URL made safe to show: `postgresql://USER:PASSWORD@HOST/DB` with its password replaced by `***`.

Every message, log line, repr and export that names the store goes through `redact`; the password
itself is read only by the driver. Text that may contain a URL somewhere (a driver's error) goes
through `redact_text`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_IN_TEXT = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)
_PASSWORD_SETTING = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)


def redact(url: str) -> str:
    """`url` with any password (in the address or a `password=` parameter) shown as `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        credentials, _, host = netloc.rpartition("@")
        user = credentials.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in credentials else f"{user}@{host}"
    return redact_text(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)))


def redact_text(text: str) -> str:
    """`text` with the passwords of URLs and of `password=` settings in it shown as `***`."""
    return _PASSWORD_SETTING.sub(r"\1***", _IN_TEXT.sub(r"\1***@", text))
