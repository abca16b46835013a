"""Webhooks (Standard Webhooks): where one may be sent (`targets.py`), ids, signatures and one
send (`signing.py`), and a tenant's endpoints and secrets (`endpoints.py`). The delivery of a
job's or batch's events, with retries and its log, is `jobs/webhook_delivery.py`. Sent by the
control plane only, never by a worker."""
