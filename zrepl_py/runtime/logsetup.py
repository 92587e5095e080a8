"""Logging set-up: human lines on stderr; botocore/urllib3/requests/paramiko never at DEBUG.

botocore and urllib3 print request headers, including credentials, at DEBUG
(boto/botocore#2626), and urllib3 each request's URL path (an apprise or webhook token), so
they are pinned to WARNING whatever ``--debug`` says.

Every message is made ``printable`` first: a job, dataset or file name holding a newline or
an ANSI escape sequence cannot forge a log line or rewrite the terminal
(docs/decisions.md#messages-and-log-lines-are-printable).
"""

from __future__ import annotations

import logging
import time

_WIRE_LOGGERS = ("botocore", "boto3", "urllib3", "requests", "s3transfer", "paramiko")
_CHATTY_LOGGERS = ("alembic",)  # announces its dialect on every catalog open
# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]
_ESCAPES = {c: ({0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}.get(c) or
                (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")) for c in _CONTROLS}


def printable(text: str) -> str:
    """``text`` on one line: every control character (newline, tab, ESC, C1, U+2028/9)
    replaced by its Python escape (``\\n``, ``\\x1b``), so it can be shown or logged as is."""
    return text.translate(_ESCAPES)


class _PrintableFormatter(logging.Formatter):
    """Formats the message part through ``printable``; a traceback (``--debug``) keeps its
    own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        record.message = printable(record.message)
        return super().formatMessage(record)


def pin_wire_loggers() -> None:
    """Set the loggers of the wire libraries (see the module doc) to WARNING."""
    for name in _WIRE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def setup_logging(level: str) -> None:
    """Configure the root logger at ``level`` (DEBUG/INFO/WARNING/ERROR) on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(_PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                             datefmt="%Y-%m-%dT%H:%M:%SZ"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.Formatter.converter = time.gmtime
    pin_wire_loggers()
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
