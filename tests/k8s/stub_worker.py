"""`python -m tests.k8s.stub_worker <the worker's arguments>`: the stub worker image of the
provider tests. It parses its command line with the real worker's CLI (`worker.__main__`), so
a pod the worker would refuse fails here too, then stands in for the runtime: it runs until
SIGTERM / SIGINT (a drain: exit 0), or exits with the code in `$STUB_DIR/<worker id>.exit`.
It writes the environment it got to `$STUB_DIR/<worker id>.env.json` for the tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import worker.__main__ as worker_main


class StubRuntime:
    def __init__(
        self,
        settings: Any,
        worker_id: str,
        accelerator: str,
        assignment: Any,
        pool_engine: str = "builtin",
    ) -> None:
        self.worker_id = worker_id
        self.dir = Path(os.environ["STUB_DIR"])

    def run(self) -> int:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        # written once it drains on SIGTERM: the tests' sign that it is up
        (self.dir / f"{self.worker_id}.env.json").write_text(json.dumps(dict(os.environ)))
        exit_file = self.dir / f"{self.worker_id}.exit"
        while not stop.wait(0.05):
            if exit_file.exists():
                time.sleep(0.1)
                return int(exit_file.read_text())
        return 0


if __name__ == "__main__":
    worker_main.WorkerRuntime = StubRuntime  # type: ignore[attr-defined,assignment]
    sys.exit(worker_main.main())
