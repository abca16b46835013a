"""What the test API server (apiserver.py) speaks: the resources it serves, a logged request,
a watch event, label selectors, JSON merge patches, and the apiVersion/kind check of a body."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from tests.k8s.errors import ApiError

# resource → (apiVersion, kind, list kind)
RESOURCES = {
    "pods": ("v1", "Pod", "PodList"),
    "secrets": ("v1", "Secret", "SecretList"),
    "leases": ("coordination.k8s.io/v1", "Lease", "LeaseList"),
}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any  # parsed JSON, or None
    status: int = 0  # the answer's code

    def grace_s(self) -> int | None:
        """A DELETE's gracePeriodSeconds (query or DeleteOptions body), or None."""
        if "gracePeriodSeconds" in self.query:
            return int(self.query["gracePeriodSeconds"])
        if isinstance(self.body, dict) and "gracePeriodSeconds" in self.body:
            return int(self.body["gracePeriodSeconds"])
        return None


@dataclass
class Event:
    version: int
    resource: str
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]


def matches(labels: dict[str, str], selector: str) -> bool:
    """Equality- and set-based label selectors (`a=b,c!=d,e,!f,g in (h,i)`)."""
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector or ""):
        term = term.strip()
        if not term:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            if (labels.get(key) in values) != (op == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def flag(value: str | None) -> bool:
    """A boolean query parameter, as Go's strconv.ParseBool reads it (the client sends True)."""
    return (value or "").lower() in ("1", "t", "true")


def typed(resource: str, body: dict[str, Any]) -> None:
    """Like the real server, take apiVersion and kind from the URL when the body leaves them
    out (the client's models do), and refuse them when they name another kind."""
    api_version, kind, _ = RESOURCES[resource]
    body.setdefault("apiVersion", api_version)
    body.setdefault("kind", kind)
    if body["kind"] != kind or body["apiVersion"] != api_version:
        raise ApiError(400, "BadRequest", f"expected {api_version} {kind}, not {body['kind']}")


def bookmark(resource: str, version: int) -> dict[str, Any]:
    api_version, kind, _ = RESOURCES[resource]
    return {"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": str(version)}}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = merge_patch(target.get(k), v)
    return target
