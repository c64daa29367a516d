"""HTTP basic authentication for the page: who may look, checked in constant time."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from dataclasses import dataclass

DEFAULT_USER = "admin"


@dataclass(frozen=True, slots=True)
class Credentials:
    """The one user and password the page accepts; ``generated``: made up at start, to be printed."""

    user: str
    password: str
    generated: bool = False

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password=***)"

    @classmethod
    def from_setting(cls, user_password: str) -> Credentials:
        """``user:password`` from the settings, else user ``admin`` and a generated password."""
        if user_password:
            user, _, password = user_password.partition(":")
            return cls(user, password)
        return cls(DEFAULT_USER, secrets.token_urlsafe(16), generated=True)

    def allows(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(header[len("Basic ") :], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return bool(sep) and ok_user and ok_password
