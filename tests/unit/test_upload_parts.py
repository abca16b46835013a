"""The part size of an upload (pure): S3 takes parts of 5 MiB or more (but the last) and at most
10,000 of them, so a file as large as the limit must still fit."""

from __future__ import annotations

import pytest

from control_plane.services.storage.files import MAX_PARTS, PART_BYTES, part_bytes_for

GiB = 2**30


@pytest.mark.parametrize("max_bytes", [0, 1, 5 * 2**20, GiB, 16 * GiB, 156 * GiB])
def test_files_up_to_the_default_part_count_use_the_default_part(max_bytes: int) -> None:
    assert part_bytes_for(max_bytes) == PART_BYTES


@pytest.mark.parametrize("max_bytes", [157 * GiB, 200 * GiB, 5 * 1024 * GiB, 200 * GiB + 1])
def test_larger_files_get_parts_large_enough_to_fit_the_part_count(max_bytes: int) -> None:
    part = part_bytes_for(max_bytes)
    assert part > PART_BYTES
    assert -(-max_bytes // part) <= MAX_PARTS  # parts needed
    assert part - 1 < PART_BYTES or -(-max_bytes // (part - 1)) > MAX_PARTS  # the smallest
