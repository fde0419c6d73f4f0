"""How this program's log lines look, wherever they are written (serve, the gateway): one line each, stamped in UTC.

`2026-12-05T04:07:13Z WARNING taskweaver_lite.web.api: ...`: an ISO time with its Z, so that the
lines of replicas and the gateway on machines in other time zones line up; a message that spans
lines (a driver's warning with its hint on the next line, a traceback) is folded onto one.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_TIME = "%Y-%m-%dT%H:%M:%SZ"


def utc_stamp() -> str:
    """Now, as log lines are stamped."""
    return time.strftime(LOG_TIME, time.gmtime())


class UtcFormatter(logging.Formatter):
    """Lines stamped in UTC, each record on one line (its exception, if any, as its last line's type and message)."""

    def converter(self, seconds: float | None) -> time.struct_time:
        """The record's time in UTC."""
        return time.gmtime(seconds)

    def format(self, record: logging.LogRecord) -> str:
        """The record on one line."""
        message = " ".join(record.getMessage().split())
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            message += f" ({type(error).__name__}: {' '.join(str(error).split())})"
        return f"{self.formatTime(record, self.datefmt)} {record.levelname} {record.name}: {message}"


def one_line_handler(stream: TextIO | None = None) -> logging.Handler:
    """A handler writing `stream` (default stderr) in this form."""
    handler: logging.StreamHandler[TextIO] = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(UtcFormatter(LOG_FORMAT, datefmt=LOG_TIME))
    return handler
