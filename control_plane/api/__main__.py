"""`python -m control_plane.api`: serve the API with uvicorn using settings from the env."""

from __future__ import annotations

import logging

import uvicorn

from control_plane.api.app import create_app
from control_plane.settings import Settings


def main() -> None:
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s api %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )


if __name__ == "__main__":
    main()
