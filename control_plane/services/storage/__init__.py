"""Object storage as tenants reach it: what a tenant may read and with which credentials
(`storage_access.py`, DESIGN §11), the reads and writes (`object_store.py`), a tenant's files in
the platform's store (`files.py`), and the encryption of registered credentials
(`secrets_box.py`)."""
