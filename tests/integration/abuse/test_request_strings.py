"""Every string a tenant's request body holds is `Text` or `Line` (api/schemas.py), so one that
is not Unicode (a lone surrogate), or a name or URL with a control character, is refused at the
edge however new the field. Read from the app's routes: a field added later is checked too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator

from control_plane.api.app import create_app
from control_plane.api.schemas import unicode_text
from control_plane.settings import Settings
from tests.unit.test_routes import routes_of


def _strings(model: type[BaseModel], seen: set[type]) -> Iterator[tuple[str, bool]]:
    """(where, whether it is Text or Line) for every `str` inside `model`'s fields."""
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        yield from _walk(field.annotation, list(field.metadata), where, seen)


def _walk(tp: Any, metadata: list[Any], where: str, seen: set[type]) -> Iterator[tuple[str, bool]]:
    origin = get_origin(tp)
    if origin is Annotated:
        base, *more = get_args(tp)
        yield from _walk(base, [*metadata, *more], where, seen)
    elif tp is str:
        checked = any(isinstance(m, BeforeValidator) and m.func is unicode_text for m in metadata)
        yield where, checked
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        yield from _strings(tp, seen)
    elif origin is dict:
        # A dict's keys are looked up by the code, never stored (a chat content part's
        # "type" and "text"); its values are walked. The part's text is checked by its model.
        yield from _walk(get_args(tp)[1], [], where + "[]", seen)
    elif origin in (list, tuple, set, Union, UnionType):
        for arg in get_args(tp):
            yield from _walk(arg, [], where + ("[]" if origin in (list, tuple, set) else ""), seen)
    elif origin is Literal or tp is Any or tp in (int, float, bool, type(None)):
        return  # no free text (Any: a batch line, validated as a JobInput of its own)
    else:
        raise AssertionError(f"{where}: a type this check does not know: {tp!r}")


def request_strings(tmp_path: Path) -> dict[str, bool]:
    # Building the app connects to nothing: the URLs are never used here.
    database_url = f"sqlite:///{tmp_path / 'unused.db'}"
    app = create_app(Settings(database_url=database_url, redis_url="redis://127.0.0.1:1"))
    out: dict[str, bool] = {}
    seen: set[type] = set()
    for route in (leaf for r in app.router.routes for leaf in routes_of(r)):
        if route.path.startswith("/internal/"):
            continue  # the workers' routes: platform code with the worker token, no tenant
        for param in route.dependant.body_params:
            out.update(_walk(param.field_info.annotation, [], route.path, seen))
    return out


def test_every_string_of_a_request_body_is_text_or_line(tmp_path: Path) -> None:
    found = request_strings(tmp_path)
    # the walk reached the bodies that carry tenants' text
    for where in ("JobInput.prompt", "JobInput.stop[]", "SamplingDefaults.stop[]",
                  "DeploymentSpec.name", "BatchCreate.input_jsonl", "CredentialCreate.region",
                  "EndpointCreate.url", "KeyCreate.name", "ChatMessage.content",
                  "CompletionRequest.prompt[]", "ChatCompletionRequest.stop[]"):  # fmt: skip
        assert where in found, sorted(found)
    assert [where for where, checked in found.items() if not checked] == []


def test_the_check_sees_a_plain_str() -> None:
    class Loose(BaseModel):
        name: str
        tags: list[str] | None = None

    assert dict(_strings(Loose, set())) == {"Loose.name": False, "Loose.tags[]": False}
