"""Loader exceptions; every message names the URI (and the tensor when there is one).

LoaderError
 ├── ObjectNotFound      the object or prefix does not exist
 ├── AccessDenied        credentials refused
 ├── CorruptCheckpoint   header unreadable, offsets out of range, truncated data
 ├── UnsupportedDtype    a dtype this loader cannot map to torch
 └── FetchError          the transfer failed (after retries)
"""

from __future__ import annotations


class LoaderError(Exception):
    def __init__(self, uri: str, message: str, tensor: str | None = None) -> None:
        where = f"{uri} (tensor {tensor!r})" if tensor else uri
        super().__init__(f"{where}: {message}")
        self.uri = uri
        self.tensor = tensor


class ObjectNotFound(LoaderError):
    pass


class AccessDenied(LoaderError):
    pass


class CorruptCheckpoint(LoaderError):
    pass


class UnsupportedDtype(LoaderError):
    pass


class FetchError(LoaderError):
    pass
