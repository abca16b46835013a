"""Loader exceptions; every message names the URI (and the tensor when there is one) and says
what the user can do about it.

LoaderError
 ├── ObjectNotFound      the object, prefix, bucket or repository does not exist
 ├── AccessDenied        credentials missing or refused
 ├── CorruptCheckpoint   header unreadable, offsets out of range, size does not match the header
 ├── UnsupportedDtype    a dtype this loader cannot map to torch
 └── FetchError          the transfer failed after every retry (timeouts, 5xx, truncated bodies)
      └── ObjectChanged  the object was replaced while it was being loaded (ETag changed)

A load that raises returns nothing: no partially loaded model ever reaches the caller.
"""

from __future__ import annotations


class LoaderError(Exception):
    """Base class; `uri` is the object, `tensor` the tensor name when one is concerned."""

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


class ObjectChanged(FetchError):
    pass
