"""The status page (/ui) in a real headless chromium against the real gateway (`voltgate serve`) serving the
real SmolLM2 GGUF, on a simulated inventory of two V100s (placement puts the model on GPU 0; the CPU build
of llama.cpp serves it on the CPU all the same).

Keys are configured: the page asks for one; a bad key is refused and nothing beyond /health is shown; an
admin key sees and uses Load/Unload, a plain key does not and the API refuses it; an alias and a model name
carrying HTML render as text. With VOLTGATE_SCREENSHOTS=1 each state is saved under docs/screenshots/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.ops.auth import hash_key
from tests.browser.conftest import SCREENSHOTS, needs_browser
from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN_KEY = "vg-browser-admin-key-3c1d"
USER_KEY = "vg-browser-user-key-9a7e"
BAD_KEY = "vg-not-a-key-0000"
XSS_ALIAS = "<img src=x onerror=alert(1)>"
XSS_MODEL = "<img src=x onerror=alert(2)>"
WAIT_S = 60.0


@pytest.fixture(scope="module")
def gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("status-page")
    entry = model_entry(smollm2_path, aliases=["smollm2", XSS_ALIAS], load="on_demand", concurrency=2)
    auth = {"keys": [
        {"id": "ops", "sha256": hash_key(ADMIN_KEY), "scopes": ["admin"]},
        {"id": "team", "sha256": hash_key(USER_KEY)},
    ], "keys_env": None}  # fmt: skip
    path = write_config(tmp, smollm2_path, free_port(), models=[entry], auth=auth)
    config = yaml.safe_load(path.read_text())
    config["gpus"] = "2xv100-16gb"  # simulated: the GPU bars have something to show
    path.write_text(yaml.safe_dump(config))
    with running_gateway(path, tmp / "gateway.log") as gw:
        loaded = httpx.post(f"{gw.url}/admin/models/{MODEL}/load", headers=_bearer(ADMIN_KEY), timeout=180)
        assert loaded.status_code == 200, loaded.text
        yield gw


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


try:
    from selenium.common.exceptions import StaleElementReferenceException
except ImportError:  # the browser fixture skips; this module must still import

    class StaleElementReferenceException(Exception):  # type: ignore[no-redef]
        pass


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except StaleElementReferenceException:  # the page redrew that part: look again
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def screenshot(browser: Any, name: str) -> None:
    if os.environ.get("VOLTGATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def open_page(browser: Any, gateway: Gateway, key: str | None) -> None:
    """Load /ui with alert() recording instead of blocking, and sign in with `key`."""
    browser.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument",
        {"source": "window.__alerts = []; window.alert = (m) => window.__alerts.push(String(m));"},
    )
    browser.get(gateway.url + "/")
    assert browser.current_url.endswith("/ui")
    if key is not None:
        wait_for(lambda: browser.find_element("id", "key-input").is_displayed(), "the key prompt")
        browser.find_element("id", "key-input").send_keys(key)
        browser.find_element("id", "key-submit").click()


def text(browser: Any, css: str) -> str:
    script = "const n = document.querySelector(arguments[0]); return n ? n.textContent : '';"
    return str(browser.execute_script(script, css))


def model_row(browser: Any) -> Any:
    return wait_for(lambda: browser.find_elements("css selector", f'#models tr[data-model="{MODEL}"]'), "the model row")


# -- no browser needed -----------------------------------------------------------------------------------
def test_page_headers_and_data_need_a_key(gateway: Gateway) -> None:
    page = httpx.get(gateway.url + "/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"):
        assert directive in csp
    assert "unsafe-inline" not in csp and "http" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert MODEL not in page.text  # the shell holds no data
    script = httpx.get(gateway.url + "/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in script.text
    assert httpx.get(gateway.url + "/", follow_redirects=False).headers["location"] == "/ui"
    for headers in ({}, _bearer(BAD_KEY)):
        refused = httpx.get(gateway.url + "/ui/api/status", headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert MODEL not in refused.text
    mine = httpx.get(gateway.url + "/ui/api/status", headers=_bearer(USER_KEY)).json()
    assert mine["admin"] is False and mine["key_id"] == "team"


# -- in the browser --------------------------------------------------------------------------------------
@needs_browser
def test_bad_key_is_refused_and_nothing_is_shown(gateway: Gateway, browser: Any) -> None:
    open_page(browser, gateway, None)
    wait_for(lambda: browser.find_element("id", "key-input").is_displayed(), "the key prompt")
    assert not browser.find_element("id", "main").is_displayed()
    browser.find_element("id", "key-input").send_keys(BAD_KEY)
    browser.find_element("id", "key-submit").click()
    message = wait_for(lambda: text(browser, "#login-error"), "the refusal")
    assert "refused" in message and "invalid_api_key" in message
    assert not browser.find_element("id", "main").is_displayed()
    assert MODEL not in browser.page_source
    assert browser.execute_script("return sessionStorage.getItem('voltgate.key')") is None
    time.sleep(2.5)  # past the next poll: the page still says why and still shows nothing
    assert text(browser, "#login-error") == message and not browser.find_element("id", "main").is_displayed()
    screenshot(browser, "login-refused")


@needs_browser
def test_renders_models_and_gpu_bars(gateway: Gateway, browser: Any) -> None:
    httpx.post(gateway.base_url + "/chat/completions", headers=_bearer(USER_KEY),
               json={"model": XSS_MODEL, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    client = gateway.client(api_key=USER_KEY)
    for _ in range(3):  # measured speed for the table and the chart
        chunks = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                                stream=True, max_tokens=24)  # fmt: skip
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    open_page(browser, gateway, ADMIN_KEY)
    row = model_row(browser)[0]
    wait_for(lambda: "ready" in row.find_element("css selector", ".state").text, "the model ready")
    assert "\u2013" not in text(browser, f'#models tr[data-model="{MODEL}"] td:nth-child(8)')  # an en dash: no data
    wait_for(lambda: browser.find_elements("css selector", "#chart-toks circle"), "the speed chart")
    cells = row.find_elements("css selector", "td")
    assert cells[2].text == "llamacpp" and cells[3].text == "Q4_1" and cells[4].text == "GPU 0"
    assert "gpu0" in cells[5].text
    pools = {p.get_attribute("data-pool"): p for p in browser.find_elements("css selector", "#pools .pool")}
    assert {"gpu0", "gpu1"} <= set(pools)
    assert "(simulated)" in pools["gpu0"].text and "V100" in pools["gpu0"].text
    used = pools["gpu0"].find_elements("css selector", f'.seg[data-model="{MODEL}"]')
    assert used and used[0].size["width"] > 0
    assert not pools["gpu1"].find_elements("css selector", ".seg[data-model]")
    # HTML in an alias and in a refused model's name is text: no element made, no alert
    assert XSS_ALIAS in row.find_element("css selector", ".aliases").text
    errors = wait_for(lambda: browser.find_elements("css selector", "#errors tbody tr"), "recent errors")
    assert any(XSS_MODEL in e.text and "model_not_found" in e.text for e in errors)
    assert not browser.find_elements("css selector", "main img")
    assert browser.execute_script("return window.__alerts") == []
    screenshot(browser, "status")


@needs_browser
def test_playground_streams_a_reply(gateway: Gateway, browser: Any) -> None:
    open_page(browser, gateway, USER_KEY)
    model_row(browser)
    wait_for(lambda: browser.find_elements("css selector", f'#pg-model option[value="{MODEL}"]'), "the model choice")
    browser.find_element("id", "pg-prompt").send_keys("Name three colours.")
    browser.find_element("id", "pg-send").click()
    stats = wait_for(lambda: "finish:" in text(browser, "#pg-stats") and text(browser, "#pg-stats"), "the reply")
    assert "tok/s" in stats and ("finish: stop" in stats or "finish: length" in stats), stats
    assert text(browser, "#pg-log .msg-assistant").strip()
    assert not browser.find_elements("css selector", "#pg-log .msg-error")
    wait_for(lambda: browser.find_elements("css selector", "#chart-toks circle"), "the speed chart")
    screenshot(browser, "playground")


@needs_browser
def test_admin_actions_only_with_an_admin_key(gateway: Gateway, browser: Any) -> None:
    open_page(browser, gateway, USER_KEY)
    row = model_row(browser)[0]
    assert not [b for b in row.find_elements("css selector", "button") if b.is_displayed()]
    status = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/admin/models/' + arguments[0] + '/unload', {method: 'POST', headers: {Authorization: 'Bearer ' + "
        "sessionStorage.getItem('voltgate.key')}}).then((r) => done(r.status));",
        MODEL,
    )
    assert status == 403
    browser.find_element("id", "signout").click()
    browser.find_element("id", "key-input").send_keys(ADMIN_KEY)
    browser.find_element("id", "key-submit").click()
    row = model_row(browser)[0]
    wait_for(lambda: row.find_element("css selector", ".action-unload").is_displayed(), "the admin buttons")
    row.find_element("css selector", ".action-unload").click()
    wait_for(lambda: text(browser, "#admin-msg") == f"unload {MODEL}: done", "the unload")
    wait_for(lambda: text(browser, f'#models tr[data-model="{MODEL}"] .state') == "unloaded", "unloaded shown")
    screenshot(browser, "admin-unloaded")
    model_row(browser)[0].find_element("css selector", ".action-load").click()
    wait_for(lambda: text(browser, "#admin-msg") == f"load {MODEL}: done", "the load", timeout_s=180)
    wait_for(lambda: text(browser, f'#models tr[data-model="{MODEL}"] .state') == "ready", "ready shown")
