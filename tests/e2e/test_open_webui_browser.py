"""Open WebUI 0.12.4's own Svelte UI in headless chromium: an image attached in the chat box reaches the
tiny VLM behind `voltgate serve` and the answer streams back into the page.

The stack is that of tests/e2e/test_open_webui_real.py (tests/e2e/openwebui_stack.py): the gateway on the
tiny VLM, the logging proxy, `open-webui serve` from its own venv (skipped, saying how to make it, when that
venv is missing; skipped too without chromium, chromedriver or selenium: tests/browser/install.sh). The
browser does what a person does: signs up the first admin in the onboarding form, picks the VLM in the model
selector, sets the chat's Function Calling to "Legacy" in Chat Controls (Open WebUI's built-in tools are a
~4,100-token prompt: minutes of prefill on a 2-core host; tests/e2e/test_open_webui_real.py records them),
attaches the PNG through the chat box's file input, types the prompt and presses Send, then waits for the
assistant's message to finish. The proxy's log shows what Open WebUI sent: an `image_url` PNG data URI,
answered 200 with streamed chunks, whose text is the text in the page. The page works offline: chromium
resolves no host but 127.0.0.1, and its network log must show no request elsewhere. The same request sent
again without its picture is 16 prompt tokens shorter (the test projector's image tokens). The final page is
saved as a screenshot (`VOLTGATE_OPENWEBUI_SCREENSHOT=FILE.png` keeps it).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import chromium, missing
from tests.e2e.conftest import Gateway
from tests.e2e.openwebui_stack import (
    ANSWER_TIMEOUT_S,
    THINKING,
    Stack,
    chat_requests,
    chat_requests_with_tasks,
    image_parts,
    openwebui_stack,
    streamed_text,
    vlm_gateway,
)
from tests.e2e.test_vision import IMAGE_TOKENS, RED, VLM

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow, pytest.mark.openwebui,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
]  # fmt: skip

PROMPT = "Describe the picture."
THINKING_PROMPT = "Explain in two sentences why the sky is blue."  # greedy SmolLM2 thinks to its budget, then answers
UI_WAIT_S = 60.0
TASKS_TIMEOUT_S = 180
# No name resolves but loopback: an asset or call to the internet would fail (and show in the network log).
OFFLINE_ARGS = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",)
LOOPBACK = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost)(:\d+)?/")


@pytest.fixture(scope="module")
def stack(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The VLM and the thinking model behind one Open WebUI, for both tests."""
    gateway = functools.partial(vlm_gateway, smollm2_path, thinking=True)
    with openwebui_stack(gateway, tmp_path_factory, "owui-browser") as running:
        yield running


class Page:
    """The selenium session on Open WebUI's page; on a timeout it saves the DOM, the console log and a
    screenshot beside the test and names them in the failure."""

    def __init__(self, driver: Any, out: Path) -> None:
        self.driver = driver
        self.out = out

    def wait(self, check: Callable[[], Any], what: str, timeout_s: float = UI_WAIT_S) -> Any:
        from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = check()
            except (StaleElementReferenceException, WebDriverException):  # redrawn, or not there yet
                value = None
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"{what}: not seen in {timeout_s} s; {self.dump('timeout')}")

    def dump(self, tag: str) -> str:
        self.driver.save_screenshot(str(self.out / f"{tag}.png"))
        (self.out / f"{tag}.html").write_text(self.driver.page_source)
        console = [f"{e['level']} {e['message']}" for e in self.driver.get_log("browser")]
        (self.out / f"{tag}.console.txt").write_text("\n".join(console))
        toasts = [t.text for t in self.css("[data-sonner-toast]")]
        return f"url {self.driver.current_url}, toasts {toasts}, DOM/console/screenshot in {self.out}/{tag}.*"

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return [e for e in self.driver.find_elements(By.CSS_SELECTOR, selector) if e.is_displayed()]

    def button(self, text: str) -> Any:
        from selenium.webdriver.common.by import By

        found = self.driver.find_elements(By.XPATH, f"//button[normalize-space()={json.dumps(text)}]")
        return next((b for b in found if b.is_displayed() and b.is_enabled()), None)

    def one(self, selector: str, what: str, timeout_s: float = UI_WAIT_S) -> Any:
        return self.wait(lambda: next(iter(self.css(selector)), None), what, timeout_s)


def sign_up(page: Page, url: str) -> None:
    """The onboarding page's "Get started", then the first admin's form (name, email, password)."""
    page.driver.get(url)
    page.wait(lambda: page.button("Get started"), "the onboarding page's Get started").click()
    page.one("input[autocomplete=name]", "the sign-up form").send_keys("Admin")
    page.one("input[type=email]", "the email field").send_keys("admin@example.com")
    page.one("input[type=password]", "the password field").send_keys("voltgate-test-1")
    page.wait(lambda: page.button("Create Admin Account"), "Create Admin Account").click()
    page.one("#chat-input", "the chat box after signing up")
    # The first visit shows the release notes ("What's New"): closed as a person does.
    ok = page.wait(lambda: page.button("Okay, Let's Go!"), "the release notes", timeout_s=10)
    ok.click()
    page.wait(lambda: page.button("Okay, Let's Go!") is None, "the release notes closed")


def enter(page: Page, url: str) -> None:
    """Into Open WebUI as its admin: signed up on a fresh instance (`sign_up`), else signed in with the form."""
    page.driver.get(url)
    first = page.wait(lambda: page.button("Get started") or page.css("input[type=email]"), "the first page")
    if not isinstance(first, list):
        sign_up(page, url)
        return
    first[0].send_keys("admin@example.com")
    page.one("input[type=password]", "the password field").send_keys("voltgate-test-1")
    page.wait(lambda: page.button("Sign in"), "Sign in").click()
    page.one("#chat-input", "the chat box after signing in")
    deadline = time.monotonic() + 5  # the release notes, if this browser has not closed them yet
    while time.monotonic() < deadline:
        if ok := page.button("Okay, Let's Go!"):
            ok.click()
            break
        time.sleep(0.25)


def select_model(page: Page, model: str) -> None:
    page.one("button[id^=model-selector-][aria-haspopup=listbox]", "the model selector").click()
    page.one(f"button[data-value={json.dumps(model)}]", f"{model} in the model list").click()
    label = f"Selected model: {model}"
    page.one(f"button[aria-label={json.dumps(label)}]", "the model selected")


def function_calling_legacy(page: Page) -> None:
    """Chat Controls → Advanced Params → Function Calling, clicked from Default through Native to Legacy."""
    from selenium.webdriver.common.by import By

    page.one("button[aria-label=Controls]", "the Chat Controls button").click()
    advanced = page.wait(lambda: page.button("Advanced Params"), "Advanced Params")
    if advanced.get_attribute("aria-expanded") != "true":
        advanced.click()

    def labels() -> list[Any]:
        found = page.driver.find_elements(By.XPATH, "//label[normalize-space()='Function Calling']")
        return [label for label in found if label.is_displayed()]

    label = page.wait(lambda: next(iter(labels()), None), "the Function Calling setting")
    control = page.driver.find_element(By.ID, label.get_attribute("for"))
    for _ in range(3):
        if control.text.strip() == "Legacy":
            break
        control.click()
        time.sleep(0.3)
    assert control.text.strip() == "Legacy", control.text
    page.one("button[aria-label=Close]", "the Chat Controls' close button").click()
    page.wait(lambda: not labels(), "Chat Controls closed")


def vision_capability(page: Page, model: str) -> Any:
    """What Open WebUI's frontend reads to allow an image: the model's `info.meta.capabilities.vision` (no
    entry under Workspace → Models: absent, which counts as on)."""
    script = """const done = arguments[arguments.length - 1];
        fetch('/api/models', {headers: {authorization: 'Bearer ' + localStorage.token}})
          .then(r => r.json()).then(j => done(j.data.find(m => m.id === arguments[0]) || null));"""
    entry = page.driver.execute_async_script(script, model)
    assert entry is not None, f"{model} is not in Open WebUI's models"
    return ((entry.get("info") or {}).get("meta") or {}).get("capabilities", {}).get("vision")


def attach_and_send(page: Page, image: Path, prompt: str) -> None:
    """The PNG through the chat box's file input (what its + menu's Upload Files opens), then the prompt."""
    from selenium.webdriver.common.by import By

    page.driver.find_element(By.CSS_SELECTOR, "input[type=file]").send_keys(str(image))
    page.one("button[aria-label='Show image preview']", "the attached image in the chat box")
    box = page.one("#chat-input", "the chat box")
    box.click()
    box.send_keys(prompt)
    page.wait(lambda: page.css("#send-message-button:enabled"), "the Send button enabled").pop().click()


def answer_when_done(page: Page, timeout_s: float) -> tuple[str, list[str]]:
    """The assistant message's text once it is done (Open WebUI shows Copy and Regenerate only then) and the
    chat is idle again (its Stop button, shown while the title and other tasks run, gone); and the texts the
    message showed on the way, as it streamed in."""
    page.one(".chat-assistant", "the assistant's message", timeout_s)
    seen: list[str] = []

    def done() -> bool:
        texts = [e.text for e in page.css(".chat-assistant #response-content-container")]
        if texts and texts[0] and (not seen or seen[-1] != texts[0]):
            seen.append(texts[0])
        return bool(page.css("button[aria-label=Regenerate]"))

    page.wait(done, "the answer finished", timeout_s)
    page.wait(lambda: not page.css("button[aria-label=Stop]"), "the chat idle (no Stop button)", TASKS_TIMEOUT_S)
    texts = [e.text for e in page.css(".chat-assistant #response-content-container")]
    assert len(texts) == 1, texts
    return str(texts[0]), [text for text in seen if text != texts[0]]


def external_requests(driver: Any) -> list[str]:
    """Every http(s)/ws(s) URL the page asked for that is not on loopback (DevTools network log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] in ("Network.requestWillBeSent", "Network.webSocketCreated"):
            params = message["params"]
            urls.append(params["request"]["url"] if "request" in params else params["url"])
    return [u for u in urls if re.match(r"^(https?|wss?)://", u) and not LOOPBACK.match(u)]


def words(text: str) -> list[str]:
    """The text's words, so that markdown rendered in the page compares with the markdown streamed."""
    return re.findall(r"\w+", text)


def begins(whole: str, part: str) -> bool:
    """Whether `part`, a text shown while streaming, is the start of `whole` (its last word may be cut)."""
    shown = words(part)[:-1]
    return words(whole)[: len(shown)] == shown


def image_exchange(log: Path, timeout_s: float = 30) -> dict[str, Any]:
    """The proxy's chat exchange that carried the picture (written when its stream ended)."""
    deadline = time.monotonic() + timeout_s
    while not (found := [e for e in chat_requests(log) if image_parts(e["body"])]):
        assert time.monotonic() < deadline, [e["body"].get("messages") for e in chat_requests(log)]
        time.sleep(0.5)
    assert len(found) == 1, len(found)
    return found[0]


def streamed_chunks(exchange: dict[str, Any]) -> list[dict[str, Any]]:
    """The image request as the gateway got it (a PNG data URI, streamed, no tools) and the chunks of its
    200 answer, which must be a stream: two chunks at least, then `[DONE]`."""
    body, events = exchange["body"], exchange["response"]
    assert exchange["status"] == 200, events
    assert body["stream"] is True and "tools" not in body, sorted(body)
    assert image_parts(body)[0]["image_url"]["url"].startswith("data:image/png;base64,")
    chunks = [e["data"] for e in events if isinstance(e.get("data"), dict)]
    assert all(chunk.get("object") == "chat.completion.chunk" for chunk in chunks), chunks
    assert len(chunks) >= 2 and events[-1].get("data") == "[DONE]", events[-3:]
    return chunks


def prompt_tokens(gateway: Gateway, body: dict[str, Any]) -> int:
    """`usage.prompt_tokens` of Open WebUI's recorded request sent again, non-streamed, for one token."""
    again = {"model": body["model"], "messages": body["messages"], "max_tokens": 1, "stream": False}
    reply = httpx.post(gateway.base_url + "/chat/completions", json=again, timeout=120)
    assert reply.status_code == 200, reply.text
    return int(reply.json()["usage"]["prompt_tokens"])


def without_images(body: dict[str, Any]) -> dict[str, Any]:
    messages = [
        {**m, "content": [p for p in m["content"] if p.get("type") != "image_url"]}
        if isinstance(m.get("content"), list) else m
        for m in body["messages"]
    ]  # fmt: skip
    return {**body, "messages": messages}


def test_an_image_attached_in_open_webuis_browser_ui_reaches_the_model_and_the_answer_streams_back(
    stack: Stack, tmp_path: Path
) -> None:
    image = tmp_path / "red.png"
    image.write_bytes(RED)
    timings: dict[str, float] = {}
    with chromium("1280,900", args=OFFLINE_ARGS, network_log=True) as driver:
        page = Page(driver, tmp_path)
        started = time.monotonic()
        sign_up(page, stack.url)
        select_model(page, VLM)
        function_calling_legacy(page)
        assert vision_capability(page, VLM) in (None, True)
        timings["sign_up_and_set_up_s"] = round(time.monotonic() - started, 1)
        sent = time.monotonic()
        attach_and_send(page, image, PROMPT)
        shown, partial = answer_when_done(page, ANSWER_TIMEOUT_S)
        timings["send_to_done_s"] = round(time.monotonic() - sent, 1)
        screenshot = tmp_path / "open-webui-browser.png"
        driver.save_screenshot(str(screenshot))
        if keep := os.environ.get("VOLTGATE_OPENWEBUI_SCREENSHOT"):
            shutil.copyfile(screenshot, keep)
        user_images = page.css(".chat-user img")
        elsewhere = external_requests(driver)
    assert user_images, "the user's message in the page shows no picture"
    assert not elsewhere, elsewhere
    exchange = image_exchange(stack.log)
    chats = chat_requests_with_tasks(stack.log, TASKS_TIMEOUT_S)  # the title, tags and follow-ups, too
    assert all(e["status"] == 200 for e in chats), [(e["status"], e["response"]) for e in chats]
    body, chunks = exchange["body"], streamed_chunks(exchange)
    streamed = streamed_text(exchange)
    assert streamed.strip() and words(shown) == words(streamed), (shown, streamed)
    # It streamed into the page: the message showed a part of the answer before the whole of it.
    assert partial and all(begins(streamed, text) for text in partial), partial
    with_image, text_only = prompt_tokens(stack.gateway, body), prompt_tokens(stack.gateway, without_images(body))
    assert with_image == text_only + IMAGE_TOKENS, (with_image, text_only)
    print("\n" + json.dumps({
        **timings, "chunks": len(chunks), "streamed": streamed, "shown": shown,
        "prompt_tokens_with_image": with_image, "prompt_tokens_without_image": text_only,
        "partial_texts_seen": len(partial), "first_partial": partial[0],
        "same_text_exactly": " ".join(shown.split()) == " ".join(streamed.split()),
        "chat_requests": [(e["body"].get("stream"), str(e["body"]["messages"][-1]["content"])[:60], e["status"])
                          for e in chats],
    }, indent=1))  # fmt: skip


def test_a_thinking_models_thought_shows_in_open_webuis_page_apart_from_its_answer(
    stack: Stack, tmp_path: Path
) -> None:
    """Issue 36: on SmolLM2 under a thinking Qwen3 template (the generation prompt opens `<think>`), the page shows
    the thinking as Open WebUI's collapsed "Thought for ..." block and the answer as the message, no tag in it."""
    with chromium("1280,900", args=OFFLINE_ARGS) as driver:
        page = Page(driver, tmp_path)
        enter(page, stack.url)
        select_model(page, THINKING)
        function_calling_legacy(page)
        box = page.one("#chat-input", "the chat box")
        box.click()
        box.send_keys(THINKING_PROMPT)
        page.wait(lambda: page.css("#send-message-button:enabled"), "the Send button enabled").pop().click()
        shown, _ = answer_when_done(page, ANSWER_TIMEOUT_S)
        html = page.css(".chat-assistant")[0].get_attribute("innerHTML")
        driver.save_screenshot(str(tmp_path / "open-webui-thinking.png"))
        if keep := os.environ.get("VOLTGATE_OPENWEBUI_THINKING_SCREENSHOT"):
            shutil.copyfile(tmp_path / "open-webui-thinking.png", keep)
    (exchange,) = [e for e in chat_requests(stack.log) if e["body"]["model"] == THINKING and e["body"]["stream"]
                   and e["body"]["messages"][-1]["content"] == THINKING_PROMPT]  # fmt: skip
    assert exchange["status"] == 200 and exchange["body"]["stream"] is True
    deltas = [choice.get("delta", {}) for chunk in streamed_chunks_of(exchange) for choice in chunk["choices"]]
    thinking = "".join(d.get("reasoning_content") or "" for d in deltas)
    answer = streamed_text(exchange)
    assert thinking.strip() and answer.strip(), deltas
    assert "<think>" not in html and "</think>" not in html, html[:3000]
    # The message shows the block's header, then the answer as markdown (a leading "1." becomes a list's number).
    rendered = words(re.sub(r"(?m)^\s*\d+\.\s", "", answer))
    assert shown.startswith("Thought for") and words(shown)[-len(rendered) :] == rendered, (shown, answer)
    print("\n" + json.dumps({"shown": shown, "streamed_answer": answer,
                              "streamed_thinking": thinking}, indent=1))  # fmt: skip


def streamed_chunks_of(exchange: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["data"] for e in exchange["response"] if isinstance(e.get("data"), dict)]
