"""Definitions import: the checks of one entry that need nothing but the entry.

``Refused`` is one entity's problem, raised by these checks and by the planner
(meta.definitions_plan) and collected there with the entry's place in the file; the rest are
pure: a regular expression compiles, a name is not empty, a password hash has the size of its
algorithm, a user in the file is the same as the one on the node, and RabbitMQ's default
hashing algorithm for an export of a given version.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from meta.models import User
from meta.password import ALGORITHMS, MD5_ALGORITHM, SHA256_ALGORITHM, check_password


class Refused(Exception):
    """One entity's problem; ``where`` is appended to its path (".name", "")."""

    def __init__(self, where: str, text: str) -> None:
        super().__init__(text)
        self.where, self.text = where, text


def default_hashing_algorithm(version: str | None) -> str:
    """rabbit_auth_backend_internal:hashing_algorithm/2 for users without one."""
    if version is not None and re.match(r"3\.[0-5]\.", version):
        return MD5_ALGORITHM
    return SHA256_ALGORITHM


def check_regex(where: str, pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as error:
        raise Refused(where, f"invalid regular expression '{pattern}': {error}") from None


def check_name(kind: str, name: str) -> None:
    if not name:
        raise Refused(".name", f"a {kind} name must not be empty")


def check_password_hash(password_hash: str, algorithm: str) -> None:
    digest = ALGORITHMS.get(algorithm)
    if digest is None:
        supported = ", ".join(sorted(ALGORITHMS))
        text = f"unsupported hashing algorithm '{algorithm}' (supported: {supported})"
        raise Refused(".hashing_algorithm", text)
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(".password_hash", "not valid base64") from None
    expected = 4 + hashlib.new(digest).digest_size
    if len(raw) != expected:
        text = f"a {algorithm} hash has {expected} bytes (4 of salt), this one {len(raw)}"
        raise Refused(".password_hash", text)


def same_user(current: User | None, new: User, password: str | None) -> bool:
    """Whether replacing ``current`` by ``new`` changes nothing (a clear-text password in
    the file was hashed with a fresh salt, so it is compared by checking it)."""
    if current is None or password is None:
        return current == new
    same_password = check_password(password, current.password_hash, current.hashing_algorithm)
    return same_password and current.tags == new.tags
