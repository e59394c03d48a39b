"""Subjects and subject filters of topics (MQTT's topic names and filters, as MetricMQ and NATS use them).

A subject is what a topic message is about: `/`-separated levels (`sensors/kitchen/temp`), 1-255 characters, no
wildcard characters (`+`, `#`) and no NUL. A filter selects subjects: a level is matched exactly, `+` matches any
one level, and `#`, alone in the last level, matches any number of remaining levels, none included (`sensors/#`
matches `sensors` and `sensors/kitchen/temp`; `#` matches everything). Empty levels are levels (`a//b` has three),
as in MQTT.

`SubjectFilter` checks a filter once and then matches subjects in Python (`matches`) and, compiled to a POSIX
extended regular expression (`regex`), on an Aerospike server, so a subscription's claim reads only the messages
its filter selects.
"""

from __future__ import annotations

import functools
import re

from ignis.errors import InvalidInputError, InvalidSpecError

MAX_SUBJECT = 255
SEPARATOR = "/"
ONE_LEVEL, ALL_LEVELS = "+", "#"
MATCH_ALL = "#"


def check_subject(subject: object) -> str:
    """A published subject, or InvalidInputError naming what is wrong with it."""
    if not isinstance(subject, str):
        raise InvalidInputError(f"subject={subject!r}: must be a string")
    if not 1 <= len(subject) <= MAX_SUBJECT:
        raise InvalidInputError(f"subject of {len(subject)} characters: must be 1-{MAX_SUBJECT} characters")
    for char, what in ((ONE_LEVEL, "'+'"), (ALL_LEVELS, "'#'"), ("\0", "NUL")):
        if char in subject:
            raise InvalidInputError(f"subject={subject!r}: {what} is not allowed in a published subject "
                                    "(wildcards belong in a subscription's filter)")
    return subject


def filter_problem(text: object) -> str | None:
    """What is wrong with a subject filter, or None."""
    if not isinstance(text, str):
        return f"filter={text!r}: must be a string"
    if not 1 <= len(text) <= MAX_SUBJECT:
        return f"filter of {len(text)} characters: must be 1-{MAX_SUBJECT} characters"
    if "\0" in text:
        return f"filter={text!r}: NUL is not allowed"
    levels = text.split(SEPARATOR)
    for i, level in enumerate(levels):
        if ALL_LEVELS in level and (level != ALL_LEVELS or i != len(levels) - 1):
            return (f"filter={text!r}: '#' must be a whole level and the last one (e.g. 'sensors/#'), "
                    f"found in level {i + 1} {level!r}")
        if ONE_LEVEL in level and level != ONE_LEVEL:
            return f"filter={text!r}: '+' must be a whole level (e.g. 'sensors/+/temp'), found {level!r}"
    return None


class SubjectFilter:
    """A checked subject filter."""

    __slots__ = ("_levels", "_pattern", "regex", "text")

    def __init__(self, text: str) -> None:
        problem = filter_problem(text)
        if problem is not None:
            raise InvalidInputError(problem)
        self.text = text
        self._levels = text.split(SEPARATOR)
        self.regex = self._to_regex()  # the filter as a POSIX extended regular expression (also a Python one)
        self._pattern = re.compile(self.regex, re.DOTALL)

    @property
    def matches_all(self) -> bool:
        return self.text == MATCH_ALL

    def _to_regex(self) -> str:
        parts: list[str] = []
        for i, level in enumerate(self._levels):
            if level == ALL_LEVELS:  # the rest, none included: 'a/#' matches 'a' too
                return "^" + "".join(parts) + ("(/.*)?$" if i else ".*$")
            parts.append(("/" if i else "") + ("[^/]*" if level == ONE_LEVEL else _ere_escape(level)))
        return "^" + "".join(parts) + "$"

    def matches(self, subject: str | None) -> bool:
        """Whether a message with this subject is selected (a message without one: only by '#')."""
        if subject is None:
            return self.matches_all
        return self.matches_all or self._pattern.match(subject) is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubjectFilter) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"SubjectFilter({self.text!r})"


@functools.lru_cache(maxsize=1024)
def subject_filter(text: str) -> SubjectFilter:
    """A checked filter (cached: subscriptions share theirs)."""
    return SubjectFilter(text)


def check_filter(text: object, source: str | None = None) -> str:
    """A filter given in a spec, or InvalidSpecError."""
    problem = filter_problem(text)
    if problem is not None:
        raise InvalidSpecError([f"subscribe.{problem}"], source)
    return text  # type: ignore[return-value]


_BRACKETED = set(".[()*+?{}|$")  # literal inside a bracket expression, in POSIX ERE and in Python alike


def _ere_escape(level: str) -> str:
    """A literal level in a POSIX ERE (and a Python regex): `^` and `\\` escaped, other specials bracketed."""
    return "".join(f"[{c}]" if c in _BRACKETED else f"\\{c}" if c in "^\\" else c for c in level)
