"""Which safetensors objects a URI names: one file, the shards of an index, or a directory's.

`resolve_objects` asks the storage (existence checks, the index, a listing); `check_index` is
pure: after the headers are read, every tensor the index promises must be in some shard.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from loader.errors import CorruptCheckpoint, LoaderError, ObjectNotFound
from loader.header import Header
from loader.options import LoadOptions
from loader.sources import ObjectStore, is_local, join_uri, local_path

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True, slots=True)
class CheckpointObjects:
    """The objects of one checkpoint, in load order.

    >>> resolve_objects("/m/model.safetensors", LoadOptions())
    CheckpointObjects(uris=('/m/model.safetensors',), index_uri=None, promised=frozenset())
    """

    uris: tuple[str, ...]  # the safetensors objects (shards sorted by name)
    index_uri: str | None  # the shard index they come from; None: no index
    promised: frozenset[str]  # tensor names the index maps to a shard (empty without an index)


def resolve_objects(
    uri: str, options: LoadOptions, store: ObjectStore | None = None
) -> CheckpointObjects:
    """A `.safetensors` object, an index (`.json`), or a directory holding either."""
    store = store or ObjectStore(options.s3)
    if uri.endswith(".safetensors") or (is_local(uri) and local_path(uri).is_file()):
        return CheckpointObjects((uri,), None, frozenset())
    named = uri.endswith(".json")  # the index itself, else look for one (one GET, no HEAD)
    index_uri = uri if named else join_uri(uri, INDEX_NAME)
    index = store.read_bytes(index_uri) if named else store.read_if_exists(index_uri)
    if index is not None:
        try:
            weight_map = json.loads(index)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptCheckpoint(index_uri, f"unreadable shard index: {exc!r}") from exc
        base = index_uri.rsplit("/", 1)[0]
        uris = tuple(join_uri(base, s) for s in shards)
        return CheckpointObjects(uris, index_uri, frozenset(weight_map))
    single = join_uri(uri, SINGLE_NAME)
    if store.exists(single):
        return CheckpointObjects((single,), None, frozenset())
    names = _list_dir(uri, store)
    found = [n for n in names if n.endswith(".safetensors")]
    if found:
        return CheckpointObjects(tuple(join_uri(uri, n) for n in found), None, frozenset())
    shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "") if names else "nothing"
    raise ObjectNotFound(
        single,
        f"no {SINGLE_NAME}, {INDEX_NAME} or *.safetensors under {uri} (found: {shown}); "
        "check the URI and that the upload finished",
    )


def check_index(objects: CheckpointObjects, headers: Iterable[Header]) -> None:
    """Raise CorruptCheckpoint if a tensor the index promises is in none of the headers."""
    if objects.index_uri is None:
        return
    stored = {e.name for h in headers for e in h.entries}
    missing = sorted(objects.promised - stored)
    if missing:
        raise CorruptCheckpoint(
            objects.index_uri,
            f"{len(missing)} tensors named in the index are in no shard "
            f"(first: {', '.join(missing[:3])})",
        )


def _list_dir(uri: str, store: ObjectStore) -> list[str]:
    if is_local(uri):
        path = local_path(uri)
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    try:
        return store.open(join_uri(uri, "probe")).list_names()
    except LoaderError:
        return []
