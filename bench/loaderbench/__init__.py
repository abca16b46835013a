"""The parts of `bench/loader.py`: `checkpoint` (what is loaded, from where), `children` (one
measured load in its own process), `contenders` (the parent's side of each load), `tiers`
(`--tiers`)."""
