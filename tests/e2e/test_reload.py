"""Config changes without a restart, on the real gateway with real llama.cpp workers (the embedded model
served under several names): a model added, one removed, one changed, while a stream on an untouched model
(and one on the changed model) is in flight; an invalid file is refused with the reason; SIGHUP reloads."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import free_port
from tests.e2e.conftest import Gateway, model_entry, running_gateway, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def entry(path: Path, name: str, **overrides: object) -> dict[str, object]:
    return model_entry(path, name, **{"concurrency": 2, "context": 1024, **overrides})


def models(gateway: Gateway) -> set[str]:
    return {m["id"] for m in httpx.get(gateway.base_url + "/models", timeout=10).json()["data"]}


def long_stream(gateway: Gateway, model: str, out: dict[str, object]) -> None:
    body = {"model": model, "prompt": "Count:", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", gateway.base_url + "/completions", json=body, timeout=300) as response:
        lines = list(response.iter_lines())
    out["status"], out["lines"] = response.status_code, lines


@pytest.fixture
def reloading(smollm2_path: Path, tmp_path: Path) -> Iterator[tuple[Gateway, Path]]:
    config = write_config(
        tmp_path, smollm2_path, free_port(),
        models=[entry(smollm2_path, "keep"), entry(smollm2_path, "change"), entry(smollm2_path, "drop")],
    )  # fmt: skip
    with running_gateway(config, tmp_path / "gateway.log") as gateway:
        yield gateway, config


def _rewrite(config: Path, smollm2_path: Path, *names_and_overrides: tuple[str, dict[str, object]]) -> None:
    data = yaml.safe_load(config.read_text())
    data["models"] = [entry(smollm2_path, name, **over) for name, over in names_and_overrides]
    config.write_text(yaml.safe_dump(data))


def test_add_remove_change_under_load(reloading: tuple[Gateway, Path], smollm2_path: Path) -> None:
    gateway, config = reloading
    kept: dict[str, object] = {}
    changed: dict[str, object] = {}
    streams = [
        threading.Thread(target=long_stream, args=(gateway, "keep", kept)),
        threading.Thread(target=long_stream, args=(gateway, "change", changed)),
    ]
    for thread in streams:
        thread.start()
    time.sleep(1.5)  # both streams are generating
    _rewrite(config, smollm2_path, ("keep", {}), ("change", {"context": 2048}), ("add", {}))
    assert all(thread.is_alive() for thread in streams)  # the reload happens while both stream
    reply = httpx.post(gateway.url + "/admin/reload", timeout=300)  # returns once "change" has drained
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert result["added"] == ["add"] and result["removed"] == ["drop"] and result["changed"] == ["change"]
    assert result["unchanged"] == ["keep"]
    for thread in streams:
        thread.join(300)
    for out in (kept, changed):  # the untouched model's stream and the changed model's old one both finish
        assert out["status"] == 200
        lines = [line for line in out["lines"] if line]  # type: ignore[attr-defined]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert len(lines) > 100  # the whole answer, not a stream cut short by the reload
        # an error event is an object with an "error" key; the text may say "error" (SmolLM2's did, in CI)
        errors = [line for line in lines[:-1] if "error" in json.loads(line.removeprefix("data: "))]
        assert not errors, (errors, gateway.log_path.read_text()[-3000:])
    assert models(gateway) == {"keep", "change", "add"}
    missing = httpx.post(gateway.base_url + "/completions", json={"model": "drop", "prompt": "x"}, timeout=30)
    assert missing.status_code == 404
    for name in ("add", "change", "keep"):
        done = httpx.post(gateway.base_url + "/completions", json={"model": name, "prompt": "Hi", "max_tokens": 2},
                          timeout=120)  # fmt: skip
        assert done.status_code == 200, (name, done.text)
    placement = httpx.get(gateway.base_url + "/placement", timeout=10).json()
    assert {d["model"] for d in placement["decisions"]} == {"keep", "change", "add"}
    status = httpx.get(gateway.url + "/ui/api/status", timeout=10).json()  # what the status page shows
    assert {m["name"] for m in status["models"]} == {"keep", "change", "add"}


def test_an_invalid_file_is_refused_and_the_old_config_keeps_running(reloading: tuple[Gateway, Path]) -> None:
    gateway, config = reloading
    good = config.read_text()
    config.write_text(good.replace("context: 1024", "context: lots", 1))
    reply = httpx.post(gateway.url + "/admin/reload", timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert "config refused" in error["message"] and "context" in error["message"]
    assert models(gateway) == {"keep", "change", "drop"}
    ok = httpx.post(gateway.base_url + "/completions", json={"model": "keep", "prompt": "Hi", "max_tokens": 2},
                    timeout=120)  # fmt: skip
    assert ok.status_code == 200


def test_sighup_reloads(reloading: tuple[Gateway, Path], smollm2_path: Path) -> None:
    gateway, config = reloading
    _rewrite(config, smollm2_path, ("keep", {}))
    gateway.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 120
    while models(gateway) != {"keep"} or "config reloaded" not in gateway.log():
        assert gateway.process.poll() is None, "SIGHUP killed the gateway"
        assert time.monotonic() < deadline, gateway.log()[-3000:]
        time.sleep(0.5)


def test_watch_config_reloads_when_the_file_changes(smollm2_path: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, smollm2_path, free_port(), models=[entry(smollm2_path, "keep")])
    with running_gateway(config, tmp_path / "gateway.log", args=["--watch-config"]) as gateway:
        _rewrite(config, smollm2_path, ("keep", {}), ("more", {}))
        deadline = time.monotonic() + 120
        while models(gateway) != {"keep", "more"}:
            assert time.monotonic() < deadline, gateway.log()[-3000:]
            time.sleep(0.5)
        gateway.wait_ready()  # the added pinned model loads
