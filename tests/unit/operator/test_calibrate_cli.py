"""`duplex calibrate --router`: what it prints of a fit, and its refusals."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from duplex import calibrate_cli
from duplex.api.spec import RecomputeCalibrationSpec

FIT = {"compute_seconds_per_token": 5.5e-3, "read_seconds_per_token": 1.5e-5, "replay_overhead_seconds": 0.57,
       "recomputes": 40, "replays": 38, "threshold": 104, "noise": 0.12}  # fmt: skip


def test_a_fit_is_described_with_what_auto_would_apply():
    text = calibrate_cli.describe(FIT)
    assert "5.5 ms" in text and "570 ms" in text and "40 recomputed, 38 read back, the median 12% off the fit" in text
    assert "reading pays     from 104 tokens" in text and "Auto applies     104 tokens" in text


@pytest.mark.parametrize("threshold, applied", [(None, 8192), (3, 16), (10**7, 8192)])
def test_auto_applies_the_bounds(threshold, applied):
    text = calibrate_cli.describe({**FIT, "threshold": threshold}, RecomputeCalibrationSpec())
    assert f"Auto applies     {applied} tokens" in text


def test_a_router_is_required():
    with pytest.raises(SystemExit):
        calibrate_cli.main([])  # --router; measuring this machine is `duplex-dev calibrate`


def test_an_unreachable_router_is_a_clear_error(capsys):
    assert calibrate_cli.main(["--router", "http://127.0.0.1:9"]) == 1
    assert "duplex calibrate:" in capsys.readouterr().err


def test_the_api_port_is_named_as_the_wrong_port(capsys):
    class BareReady(BaseHTTPRequestHandler):  # what a router's API port answers on /ready
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"ready": true}')

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), BareReady)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert calibrate_cli.main(["--router", f"http://127.0.0.1:{server.server_port}"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert "API port; give its admin port" in capsys.readouterr().err
