"""The worker's model load from a real S3-compatible server: config, tokenizer and generation
config are read through the load's own `ObjectStore` (S3 credentials resolved once), the
weights bitwise those `safetensors` reads; `LoadedModel.fill_tiers()` fills the cache tiers
after the load, so the next worker's load is a host-memory hit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import loader
from loader.s3 import S3Endpoint, s3_client
from worker.model.demo import create_demo_model
from worker.model.weights import build_model
from worker.runtime.loading import load_model


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_demo_model(tmp_path_factory.mktemp("demo") / "m", seed=0, train_steps=0)


def upload(demo: Path, prefix: str, skip: tuple[str, ...] = ()) -> str:
    client = s3_client()
    for path in demo.iterdir():
        if path.name not in skip:
            client.upload_file(str(path), "test", f"{prefix}/{path.name}")
    return f"s3://test/{prefix}/"


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[loader.S3Options]:
    """Every run of the S3 credential chain."""
    calls: list[loader.S3Options] = []
    resolve = S3Endpoint.resolve.__func__  # type: ignore[attr-defined]

    def counting(cls: type[S3Endpoint], options: loader.S3Options) -> S3Endpoint:
        calls.append(options)
        return resolve(cls, options)  # type: ignore[no-any-return]

    monkeypatch.setattr(S3Endpoint, "resolve", classmethod(counting))
    return calls


def assert_weights(loaded: Any, demo: Path) -> None:
    want = build_model(loaded.model.config, load_file(str(demo / "model.safetensors")))
    got = loaded.model.state_dict()
    for name, tensor in want.state_dict().items():
        assert torch.equal(got[name], tensor), name


def test_the_model_files_and_weights_share_one_s3_client(
    demo: Path, s3_env: Any, resolutions: list[loader.S3Options]
) -> None:
    uri = upload(demo, "worker-one")
    loaded = load_model(uri)
    assert len(resolutions) == 1, "one credential resolution for config, tokenizer, weights"
    config = json.loads((demo / "config.json").read_text())
    assert loaded.max_context == config["max_position_embeddings"]
    assert loaded.tokenizer.get_vocab_size() == config["vocab_size"]
    assert_weights(loaded, demo)


def test_a_missing_generation_config_is_optional_and_a_missing_config_is_an_error(
    demo: Path, s3_env: Any
) -> None:
    uri = upload(demo, "worker-nogen", skip=("generation_config.json",))
    loaded = load_model(uri)
    assert loaded.eos_token_ids == frozenset(
        [json.loads((demo / "config.json").read_text())["eos_token_id"]]
    )
    bare = upload(demo, "worker-noconfig", skip=("config.json",))
    with pytest.raises(loader.ObjectNotFound, match=r"worker-noconfig/config\.json"):
        load_model(bare)


def test_fill_tiers_after_the_load_makes_the_next_load_a_host_hit(
    demo: Path, s3_env: Any, tmp_path: Path
) -> None:
    uri = upload(demo, "worker-tiers")
    options = loader.LoadOptions(
        cache_dir=str(tmp_path / "disk"),
        host_cache_dir=str(tmp_path / "host"),
        host_cache_max_bytes=1 << 30,
    )
    first = load_model(uri, options=options)
    assert loader.cached_uris(tmp_path / "host") == set()
    first.fill_tiers()
    first.fill_tiers()  # idempotent
    weights = uri + "model.safetensors"
    assert (
        loader.cached_uris(tmp_path / "host") == loader.cached_uris(tmp_path / "disk") == {weights}
    )
    second = load_model(uri, options=options)
    assert second.metrics.tier_hits == {"host": 1}
    assert_weights(second, demo)
    second.fill_tiers()  # nothing to fill: returns at once


def test_an_object_store_reads_optional_files_with_one_request(s3_env: Any, tmp_path: Path) -> None:
    s3_client().put_object(Bucket="test", Key="store/a.json", Body=b"{}")
    store = loader.ObjectStore()
    assert store.read_if_exists("s3://test/store/a.json") == b"{}"
    assert store.read_if_exists("s3://test/store/absent.json") is None
    assert store.exists("s3://test/store/a.json") and not store.exists("s3://test/store/b.json")
    (tmp_path / "f").write_bytes(b"x")
    assert store.read_if_exists(str(tmp_path / "f")) == b"x"
    assert store.read_if_exists(str(tmp_path / "absent")) is None
    assert store.read_if_exists(str(tmp_path)) is None  # a directory is no object
