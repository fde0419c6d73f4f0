"""The web server (`serve`) on a free port of 127.0.0.1, in a thread: for the tests and the bench."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn

from taskweaver_lite.config.settings import Config
from taskweaver_lite.web.app import build_app
from taskweaver_lite.web.auth import Access
from taskweaver_lite.web.connections import server_settings


class WebServer:
    """`with WebServer(config) as server:` serves `server.url` until the block ends (sessions closed)."""

    def __init__(self, config: Config, *, token: str | None = None) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = build_app(config, Access(token))
        settings = server_settings(self.app, config.serve, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self._server = uvicorn.Server(settings)
        self._thread = threading.Thread(target=self._server.run, name="web-server", daemon=True)

    def __enter__(self) -> WebServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the web server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._server.should_exit = True
        self._thread.join(30)
