"""The blocking SDK modules are generated from their asyncio twins by tests/tools/unasync.py: these
tests fail when a generated file was edited by hand, or its source changed without running
`python tests/tools/unasync.py`."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from tests.tools import unasync

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("source", sorted(unasync.PAIRS))
def test_the_generated_blocking_module_is_current(source: str) -> None:
    target = unasync.PAIRS[source]
    expected = unasync.render(source, ROOT)
    actual = (ROOT / target).read_text(encoding="utf-8")
    diff = difflib.unified_diff(
        actual.splitlines(), expected.splitlines(), target, f"{target} from {source}", lineterm=""
    )
    assert actual == expected, (
        f"{target} is stale: run python tests/tools/unasync.py\n" + "\n".join(list(diff)[:40])
    )


def test_every_async_module_has_its_generated_twin() -> None:
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "sdk").glob("_async_*.py")}
    assert sources == set(unasync.PAIRS)


def test_unasync_deletes_and_renames_only() -> None:
    code = (
        "import asyncio\n"
        "from sdk._async_batches import AsyncBatches\n"
        "class _AsyncThing(AsyncResource):\n"
        "    async def run(self, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):\n"
        "        async with self._http as http:\n"
        "            async for line in http.aiter_lines():\n"
        "                await self._sleep(1)\n"
        "        await self.aclose()\n"
        "    def __aiter__(self) -> AsyncIterator[str]: ...\n"
        "    async def _lines(self) -> AsyncGenerator[dict[str, Any], None]: ...\n"
    )
    assert unasync.unasync(code) == (
        "from sdk._batches import Batches\n"
        "class _Thing(Resource):\n"
        "    def run(self, sleep: Callable[[float], None] = time.sleep):\n"
        "        with self._http as http:\n"
        "            for line in http.iter_lines():\n"
        "                self._sleep(1)\n"
        "        self.close()\n"
        "    def __iter__(self) -> Iterator[str]: ...\n"
        "    def _lines(self) -> Generator[dict[str, Any], None, None]: ...\n"
    )


@pytest.mark.parametrize(
    "code", ["results = await asyncio.gather(a, b)\n", "task = asyncio.create_task(f())\n"]
)
def test_unasync_refuses_what_has_no_blocking_form(code: str) -> None:
    with pytest.raises(ValueError, match="no blocking form"):
        unasync.unasync(code)
