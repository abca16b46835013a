"""The parts of `bench/control_plane.py`: `load` (client threads and processes), `warm` (the warm
path and SSE, one request at a time), `measure` (one platform, measured), `report` (the tables
and the JSON line)."""
