"""Encryption at rest of secrets the platform must read back (a tenant's storage credentials).

Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from `PLATFORM_SECRET_KEY`; the
embedded platform generates that secret on its first start and keeps it beside its other
credentials. Without it, storing such a secret is refused rather than done in the clear.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken

from control_plane.errors import ControlPlaneError, Unavailable
from control_plane.settings import Settings

# Separates this use of PLATFORM_SECRET_KEY from any other the platform may add later.
_CONTEXT = b"platform/storage-credentials/v1:"


def _fernet(settings: Settings) -> Fernet:
    secret = settings.secret_key.get_secret_value()
    if not secret:
        raise Unavailable(
            "storing credentials needs PLATFORM_SECRET_KEY on the control plane (the operator "
            "sets it; `platform up` generates one)"
        )
    digest = hashlib.sha256(_CONTEXT + secret.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(settings: Settings, plaintext: str) -> str:
    return _fernet(settings).encrypt(plaintext.encode()).decode()


def open_(settings: Settings, ciphertext: str) -> str:
    try:
        return _fernet(settings).decrypt(ciphertext.encode()).decode()
    except InvalidToken:
        # The key changed since this was stored: an operator error, not the client's.
        raise ControlPlaneError("a stored credential cannot be decrypted") from None


__all__ = ["open_", "seal"]
