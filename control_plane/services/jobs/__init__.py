"""A job's life, one module per step (DESIGN §4-§5).

    admission.py         quota, context check, the row committed before anything else
    handoff.py           claimed at admission for a worker with a free slot, pushed to its list
    dispatch.py          otherwise a wake-up on the deployment's broker queue
    claims.py            a worker claims it: a new, fenced attempt, and what follows
    cold_starts.py       what a job waiting on a booting worker is told (phase, bytes, ETA)
    events.py            its event stream in Redis (deltas, state changes, its end)
    finish.py            the one path to a terminal state (`outbox.py`: where it is announced)
    local_ends.py        a sync caller in the same API process gets the end handed over
    callers.py           what the caller sees: read, cancel, wait for the end, follow events
    webhook_delivery.py  its webhooks sent, retried and logged (a Celery task's body)
    job_store.py         create, read, list, the public shape (`job_queries.py`: the loop's reads)
    batches.py           many jobs from one JSONL input (`batch_slots.py`: its bounded fan-out)
    job_traces.py, timeline.py   where a job's time went (traces, the console's timeline)

Each module says what holds at its step; `finish.py` is the only way out of an active state.
"""
