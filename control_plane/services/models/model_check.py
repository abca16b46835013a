"""Deploy-time check of a deployment's model: would a worker accept it?

Before a deployment is created or its model changed, the model directory is read with the
tenant's own `Access` (what the tenant may read, nothing more):

- `config.json` must be a JSON object; what it says (architectures, quantization, whether the
  built-in engine's own parser, `ModelConfig.from_hf_dict`, accepts it) is returned as a
  `Checkpoint`, from which the deployment's engine is chosen (domain/engine_choice.py: what
  no engine it allows can serve is refused there);
- the weights must exist: `model.safetensors.index.json` and every shard it names, or a
  single `model.safetensors`, or else the `*.safetensors` files in the directory (what the
  loader falls back to);
- each weights file's safetensors header must parse (the loader's `header_length` and
  `parse_header`), read with ranged reads: the data section is never fetched;
- with an index, every tensor it promises must be in some shard (the loader's `check_index`).

Every failure is an InvalidRequest (422) naming the model URI and what is wrong. A missing
and a forbidden object answer alike (`object_store`), so the check tells a tenant nothing
about objects it may not read. `hf://` models are not read: the Hub would become a network
dependency of every deploy; their workers report problems as before, and the engine choice is
told so (`Checkpoint.unread`).

Pure imports only: `common.model_config` and `loader.header`/`loader.objects` import no torch.
"""

from __future__ import annotations

import json
import re
from typing import Any

from control_plane.domain.engine_choice import Checkpoint
from control_plane.errors import InvalidRequest
from control_plane.services.storage import object_store
from control_plane.services.storage.storage_access import Access
from loader.errors import LoaderError
from loader.header import HEADER_PREFIX_BYTES, Header, header_length, parse_header
from loader.objects import INDEX_NAME, SINGLE_NAME, CheckpointObjects, check_index

CONFIG_NAME = "config.json"
# config.json and shard indexes are small; a larger one is refused rather than downloaded.
MAX_JSON_BYTES = 16 * 1024 * 1024
# Largest checkpoints have a few hundred shards; each costs three requests here.
MAX_SHARDS = 1_000
# A shard is a file beside the index: a plain name, never a path (no "..", no "/").
_SHARD_NAME = re.compile(r"^(?!\.\.?$)[A-Za-z0-9._-]{1,255}$")


HF_NOT_READ = "hf:// models are not read at deploy"


def check_model(access: Access) -> Checkpoint:
    """What `access`'s config.json says, once its weights are found whole; InvalidRequest
    (field `model`) when a worker could not load it whatever its engine."""
    checkpoint = read_checkpoint(access)
    if checkpoint.not_read:
        return checkpoint
    objects = _weights(access)
    headers = [_header(access, name) for name in objects.uris]
    try:
        check_index(objects, headers)
    except LoaderError as exc:
        raise _bad(access, str(exc)) from None
    return checkpoint


def read_checkpoint(access: Access) -> Checkpoint:
    """What config.json says (an unchanged model whose engine or accelerator_count changed:
    its weights were checked when it was deployed)."""
    if access.location.kind == "hf":
        return Checkpoint.unread(HF_NOT_READ)
    return Checkpoint.from_config(_read_json(access, CONFIG_NAME))


def _weights(access: Access) -> CheckpointObjects:
    """The weights files (names inside the model directory) a worker would load."""
    try:
        data = object_store.read(access.child(INDEX_NAME), MAX_JSON_BYTES, field="model")
    except InvalidRequest:
        # No index (or none readable: the same answer): a single model.safetensors, else
        # every *.safetensors in the directory, as the loader reads them; each header checked.
        found = object_store.list_names(access, ".safetensors", MAX_SHARDS + 1)
        if SINGLE_NAME in found or not found:
            return CheckpointObjects((SINGLE_NAME,), None, frozenset())
        if len(found) > MAX_SHARDS:
            raise _bad(access, f"more than {MAX_SHARDS} .safetensors files") from None
        return CheckpointObjects(tuple(found), None, frozenset())
    index = _parse_json(access, INDEX_NAME, data)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise _bad(access, f"{INDEX_NAME}: weight_map must be a non-empty object")
    shards = sorted({str(s) for s in weight_map.values()})
    bad = [s for s in shards if not _SHARD_NAME.fullmatch(s)]
    if bad:
        raise _bad(access, f"{INDEX_NAME}: shard {bad[0]!r} is not a file name")
    if len(shards) > MAX_SHARDS:
        raise _bad(access, f"{INDEX_NAME}: {len(shards)} shards; at most {MAX_SHARDS}")
    return CheckpointObjects(tuple(shards), INDEX_NAME, frozenset(map(str, weight_map)))


def _header(access: Access, name: str) -> Header:
    """The safetensors header of `name`: two ranged reads (the length, then the JSON)."""
    child = access.child(name)
    try:
        prefix, size = object_store.read_range(child, 0, HEADER_PREFIX_BYTES)
    except InvalidRequest:
        if name == SINGLE_NAME:
            raise _bad(
                access,
                f"neither {INDEX_NAME} nor {SINGLE_NAME} nor any *.safetensors file exists "
                "or is readable",
            ) from None
        raise _bad(
            access, f"shard {name} named in {INDEX_NAME} does not exist or is not readable"
        ) from None
    try:
        n = header_length(name, prefix, size)
        raw, _ = object_store.read_range(child, HEADER_PREFIX_BYTES, n)
        return parse_header(name, raw, size)
    except LoaderError as exc:
        raise _bad(access, str(exc)) from None


def _read_json(access: Access, name: str) -> dict[str, Any]:
    return _parse_json(access, name, object_store.read(access.child(name), MAX_JSON_BYTES, "model"))


def _parse_json(access: Access, name: str, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        # RecursionError: nesting deeper than the parser's stack (a crafted file)
        raise _bad(access, f"{name}: not valid JSON") from None
    if not isinstance(doc, dict):
        raise _bad(access, f"{name}: not a JSON object")
    return doc


def _bad(access: Access, what: str) -> InvalidRequest:
    return InvalidRequest(
        f"model {access.location.uri}: {what}",
        errors=[{"field": "model", "message": what}],
    )
