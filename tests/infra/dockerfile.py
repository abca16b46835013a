"""A small Dockerfile reader for tests/infra (no docker here): instructions with their
arguments, continuation lines joined, comments dropped, split into stages."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str  # upper-case, e.g. "COPY"
    args: str  # the rest of the line, continuations joined
    stage: int  # index of the FROM it belongs to (-1: before the first FROM)

    def words(self) -> list[str]:
        """Arguments as a list, from the exec (JSON) form or the shell form."""
        if self.args.startswith("["):
            words: list[str] = json.loads(self.args)
            return words
        return shlex.split(self.args)


def parse(path: Path) -> list[Instruction]:
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, args.strip(), stage))
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def env(instructions: list[Instruction]) -> dict[str, str]:
    """ENV values of these instructions (the `KEY=VALUE ...` form)."""
    out: dict[str, str] = {}
    for i in instructions:
        if i.keyword == "ENV":
            for word in shlex.split(i.args):
                key, _, value = word.partition("=")
                out[key] = value
    return out


def build_args(instructions: list[Instruction]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i in instructions:
        if i.keyword == "ARG":
            key, _, value = i.args.partition("=")
            out[key] = value
    return out
