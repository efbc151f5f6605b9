"""`duplex-dev calibrate`: its arguments are checked before any engine starts."""

from __future__ import annotations

from duplex_dev import calibrate


def test_arguments_are_checked(capsys):
    assert calibrate.main(["--conversations", "2"]) == 2
    assert "at least 4" in capsys.readouterr().err
