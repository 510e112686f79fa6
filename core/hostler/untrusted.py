"""Outside text parsed within bounds: JSON and whole numbers (pure: no I/O, no clock).

Python's own parsers have two holes for text hostler does not control (a model's
``config.json``, an engine's HTTP body, an environment variable):

* ``json.loads`` recurses once per nested array or object and raises ``RecursionError`` (not
  ``ValueError``) past the interpreter's depth: a few KiB of ``[`` crash the caller;
* ``int`` refuses more than 4300 digits with a ``ValueError`` of its own wording.

:func:`parse_json` turns the first into a ``ValueError`` like any other bad JSON, so a
caller's one ``except ValueError`` covers every refusal; :func:`parse_whole` reads at most
:data:`WHOLE_DIGITS` significant digits and saturates beyond, so a caller's range check words
the refusal ("absurdly large") whatever the length.
"""

from __future__ import annotations

import json
import re

__all__ = ["WHOLE_CEILING", "WHOLE_DIGITS", "parse_json", "parse_whole"]

#: The most significant digits :func:`parse_whole` converts; a longer number saturates.
WHOLE_DIGITS = 30
#: What :func:`parse_whole` returns (with the sign) for a number of more digits.
WHOLE_CEILING = 10**WHOLE_DIGITS

_WHOLE = re.compile(r"\s*([+-]?)0*([0-9]+)\s*")


def parse_json(data: str | bytes | bytearray) -> object:
    """``data`` decoded as JSON, or ValueError for any text that is not (read) JSON.

    Raises:
        ValueError: Not JSON, not UTF-8/16/32 (``UnicodeDecodeError`` is a ValueError), a
            number past ``int``'s digit limit, or nested deeper than the decoder recurses
            ("nests too deep to read": the decoder's RecursionError, caught here).
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nests too deep to read") from None


def parse_whole(text: str) -> int | None:
    """The whole number ``text`` writes (blanks around and leading zeros allowed), else None.

    A number of more than :data:`WHOLE_DIGITS` significant digits is not converted: it reads
    as ``±WHOLE_CEILING``, larger than any setting's bound, so the caller's range check
    refuses it in its own words; ``int`` never sees more than 30 digits.
    """
    match = _WHOLE.fullmatch(text)
    if match is None or not text.isascii():
        return None
    sign, digits = match.groups()
    value = WHOLE_CEILING if len(digits) > WHOLE_DIGITS else int(digits)
    return -value if sign == "-" else value
