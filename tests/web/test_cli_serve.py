"""`sparsemm serve`: arguments reach uvicorn; loopback by default, a warning otherwise."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sparsemm.cli.main import main
from sparsemm.pipeline.serve import allowed_hosts, is_loopback

uvicorn = pytest.importorskip("uvicorn", reason="the web extra (uvicorn) is not installed")


@pytest.fixture()
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def fake_run(app: Any, **kwargs: Any) -> None:
        calls.append({"app": app, **kwargs})

    monkeypatch.setattr(uvicorn, "run", fake_run)
    # nothing is bound: a server the developer runs on the default port changes nothing
    monkeypatch.setattr("sparsemm.pipeline.serve.check_port_free", lambda host, port: None)
    return calls


def test_serve_binds_loopback_by_default(
    web_collection: Path, served: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert main(["serve", str(web_collection), "--port", "8123"]) == 0
    (call,) = served
    assert call["host"] == "127.0.0.1" and call["port"] == 8123
    # (the app itself warns about the toy collection's decoy images; that is not the bind)
    assert not [
        r for r in caplog.records if r.name == "sparsemm.pipeline.serve" and r.levelno >= 30
    ]
    assert call["app"].state.service.health().items > 0


def test_serve_warns_when_binding_elsewhere(
    web_collection: Path, served: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert main(["serve", str(web_collection), "--host", "0.0.0.0"]) == 0
    assert served[0]["host"] == "0.0.0.0" and served[0]["port"] == 8000
    assert any("reachable from the network" in r.getMessage() for r in caplog.records)


def test_serve_errors(tmp_path: Path, served: list[dict[str, Any]], capsys) -> None:
    assert main(["serve", str(tmp_path), "--port", "0"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert "not a sparsemm collection" in capsys.readouterr().err
    assert not served


def test_a_busy_port_is_one_error_line_before_the_collection_loads(
    web_collection: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve` on a port another server holds printed "serving ... at" and then uvicorn's
    own error ("address already in use", exit 3); `up` already checked. It is one line."""
    import socket

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("uvicorn must not start")

    monkeypatch.setattr(uvicorn, "run", never)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert main(["serve", str(web_collection), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err, err
    assert "serving" not in err


def test_host_helpers() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert not is_loopback("example.org")
    assert allowed_hosts("0.0.0.0", []) == ["*"]
    assert "lab.example" in allowed_hosts("0.0.0.0", ["lab.example"])
    assert "*" not in allowed_hosts("0.0.0.0", ["lab.example"])
    assert "192.168.1.5" in allowed_hosts("192.168.1.5", [])
