"""The one checker of the fault suite: what must hold after any fault, read from the platform's
own stores (SQL ledger, Redis) and from a webhook receiver's log. DESIGN §5 in executable form.

    I1  every admitted job (the client got 201/202) reaches a terminal state within a bound
    I2  at most one accepted result per job; each job billed once, for its final attempt;
        no attempt of an ended job left open; every succeeded job billed
    I3  one distinct `webhook-id` per (job, event); every attempt validly signed (the
        `standardwebhooks` package, the tenant's secret)
    I4  the billing records of each worker tile its life: no overlap, gap or duplicate
    I5  `services.workers.billing.check` reports nothing
    I6  no broker message (kombu's `unacked` hash / `unacked_index` zset) unacked longer than
        a bound after nothing needs it; no stream entry pending in a consumer group longer
        (the platform uses no groups today; XINFO GROUPS on every stream would show one)

`check()` (gather.py) gathers (I/O), then the `judge_*` functions (judges.py) decide (pure,
over plain rows; evidence.py holds the rows and the bounds). Things that must hold
*eventually* (billing allocations, webhooks, acks) are polled until they hold or the bounds
pass, so a violation means "did not happen within the bound", never "not yet".

NOTE: the checker never prints prompts, outputs or webhook bodies: ids, counts and ages only.
"""

from tests.faults.invariants.evidence import (
    TERMINAL_STATUSES,
    Bounds,
    Evidence,
    Snapshot,
    Unacked,
    Violation,
    WebhookEvidence,
    assert_holds,
)
from tests.faults.invariants.gather import check
from tests.faults.invariants.judges import (
    judge_broker,
    judge_results,
    judge_terminal,
    judge_tiling,
    judge_webhooks,
)

__all__ = [
    "TERMINAL_STATUSES",
    "Bounds",
    "Evidence",
    "Snapshot",
    "Unacked",
    "Violation",
    "WebhookEvidence",
    "assert_holds",
    "check",
    "judge_broker",
    "judge_results",
    "judge_terminal",
    "judge_tiling",
    "judge_webhooks",
]
