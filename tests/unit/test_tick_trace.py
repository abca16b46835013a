"""Which reconciler ticks get a trace of their own (`reconcile/tick_trace.py`)."""

from __future__ import annotations

from control_plane.reconcile.tick_trace import SLOW_TICK_S, TickTrace


def test_a_tick_is_drawn_when_it_acted_failed_or_was_slow() -> None:
    t = TickTrace()
    quick = t.start_ns + int(SLOW_TICK_S * 1e9) - 1
    assert not t.worth_recording(quick, failed=False)  # changed nothing, in time
    assert t.worth_recording(quick, failed=True)
    assert t.worth_recording(t.start_ns + int(SLOW_TICK_S * 1e9), failed=False)
    t.actions.append(("worker.start", t.start_ns, {}))
    assert t.worth_recording(quick, failed=False)
