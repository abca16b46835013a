"""Tenants and what every call checks first: API keys (`api_keys.py`), quotas (`quotas.py`),
and the per-process cache of keys, deployments and limits (`edge_cache.py`)."""
