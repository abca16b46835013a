"""Workers as the control plane records them: their rows and phase transitions
(`worker_records.py`) and the billing record each closed phase becomes (`billing.py`)."""
