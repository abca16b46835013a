"""Which worker pods cannot start, from their status (providers/kubernetes/stuck.py), and how
the pod tracker reports them: once, with the reason, at once or after the grace."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.providers.base import Exited
from control_plane.providers.kubernetes.pods import WORKER_ID_LABEL
from control_plane.providers.kubernetes.stuck import MAX_MESSAGE, Stuck, stuck_reason
from control_plane.providers.kubernetes.tracker import PodTracker


def pod(worker_id: str = "w1", **status: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {WORKER_ID_LABEL: worker_id}}, "status": status}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": message}}
    return {"containerStatuses": [{"name": "worker", "state": state}]}


UNSCHEDULABLE = {"conditions": [{"type": "PodScheduled", "status": "False",
                                 "reason": "Unschedulable", "message": "0/1 nodes"}]}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Pending", **waiting("ImagePullBackOff", "no such image")},
         Stuck("image_pull: ImagePullBackOff: no such image", waits=False)),
        ({"phase": "Pending", **waiting("ErrImagePull")}, Stuck("image_pull: ErrImagePull", False)),
        ({"phase": "Pending", **waiting("CreateContainerConfigError", "secret x not found")},
         Stuck("pod_config: CreateContainerConfigError: secret x not found", False)),
        ({"phase": "Pending", **UNSCHEDULABLE},
         Stuck("unschedulable: no node can take it: 0/1 nodes", waits=True)),
        ({"phase": "Pending", **waiting("ContainerCreating")}, None),
        ({"phase": "Running"}, None),
        ({"phase": "Failed", **waiting("ImagePullBackOff")}, None),
    ],
)  # fmt: skip
def test_stuck_reason(status: dict[str, Any], expected: Stuck | None) -> None:
    assert stuck_reason({"status": status}) == expected


def test_long_messages_are_cut() -> None:
    stuck = stuck_reason({"status": {"phase": "Pending", **waiting("ErrImagePull", "x" * 5000)}})
    assert stuck is not None and len(stuck.reason) < MAX_MESSAGE + 40


def test_the_tracker_reports_a_stuck_pod_once_with_its_reason() -> None:
    t = PodTracker()
    assert t.observe("ADDED", pod(phase="Pending"), 0.0) == []
    (e,) = t.observe("MODIFIED", pod(phase="Pending", **waiting("ImagePullBackOff")), 1.0)
    assert e == Exited("w1", -9, "image_pull: ImagePullBackOff")
    assert t.observe("MODIFIED", pod(phase="Pending", **waiting("ImagePullBackOff")), 2.0) == []
    assert t.observe("DELETED", pod(phase="Pending"), 3.0) == [], "reported already"


def test_an_unschedulable_pod_is_reported_after_the_grace_unless_it_gets_a_node() -> None:
    t = PodTracker()
    t.observe("ADDED", pod("a", phase="Pending", **UNSCHEDULABLE), 10.0)
    t.observe("ADDED", pod("b", phase="Pending", **UNSCHEDULABLE), 10.0)
    t.observe("MODIFIED", pod("b", phase="Pending", **UNSCHEDULABLE), 50.0)  # same wait
    assert t.overdue(69.9, 60.0) == []
    t.observe("MODIFIED", pod("a", phase="Running"), 65.0)  # a got a node
    assert t.overdue(70.0, 60.0) == [
        Exited("b", -9, "unschedulable: no node can take it: 0/1 nodes")
    ]
    assert t.overdue(500.0, 60.0) == []
    assert t.alive() == {"a"}
