"""The chat page that `dserve serve` serves at / (src/server/ui/chat.html), in a real
browser: Debian's Chromium, headless, driven by Selenium through Debian's chromedriver
(given by path, so Selenium Manager never runs or downloads anything).

What the page shows is checked against the official `openai` SDK's answer to the same
request: the streamed text grows across polls and ends equal to the SDK's greedy
(temperature 0) reply, a second turn carries the conversation, DeepSeek-R1's
reasoning_content is shown apart from the answer, Stop ends the stream and the server
frees the request (/metrics: nothing running, one more aborted request), and with
--api-key the page loads without a key, asks for one on a 401 and works once it is
entered. The page's headers are checked with hashlib (the CSP's script and style
hashes) and plain HTTP (ETag / 304); --disable-ui makes / a 404.

A screenshot of the conversation is written under the test's tmp dir and copied to
build/test-artifacts/chat_page.png.
"""
import base64
import hashlib
import json
import re
import shutil
import time
import urllib.request

import openai
import pytest

import server_util
from conftest import REPO, build_dir

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian's chromium and chromium-driver (make test installs them)")

API_KEY = "page-test-key"
SERVER_ARGS = ("--served-model-name", "smollm2", "--threads", 2, "--max-model-len", 4096,
               "--kv-cache-memory", 128 << 20)
AUTH_HINT = "needs an API key"  # in the page's message for a 401


# ---- the browser and the servers ---------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,800", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("chat-page") / "serve.log"
    with server_util.running(dserve_bin, default_model, *SERVER_ARGS, log_path=log) as s:
        yield s


def sdk(server, api_key="none"):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=api_key, max_retries=0)


def http_get(url, headers=None):
    """(status, headers, body) of a GET, errors included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def metric(server, family, **labels):
    """The sum of a /metrics family's samples (counters: their _total) with these labels."""
    samples = server.metrics()[family].samples
    return sum(s.value for s in samples if not s.name.endswith("_created")
               and all(s.labels.get(k) == v for k, v in labels.items()))


# ---- driving the page ----------------------------------------------------------------

def wait_for(what, condition, timeout=60, interval=0.05):
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(interval)


def open_page(driver, server):
    """Loads the page afresh (localStorage cleared) and waits for its model list."""
    driver.get(server.base_url + "/")
    driver.execute_script("localStorage.clear()")
    driver.refresh()
    wait_for("the page's script", lambda: driver.execute_script(
        "return document.body.dataset.busy === 'false'"))


def by_id(driver, element_id):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, element_id)


def wait_for_models(driver):
    return wait_for("the model list", lambda: driver.execute_script(
        "return [...document.getElementById('model').options].map(o => o.value)"))


def type_into(driver, element_id, text):
    """Types like a user, then leaves the field (a change event, as on a real blur)."""
    from selenium.webdriver.common.keys import Keys
    field = by_id(driver, element_id)
    field.clear()
    field.send_keys(str(text) + Keys.TAB)


def settings(driver, **values):
    """Opens the settings and types the given ones (ids: system-prompt, temperature,
    top-p, max-tokens, api-key)."""
    if not by_id(driver, "settings").is_displayed():
        by_id(driver, "toggle-settings").click()
    for element_id, value in values.items():
        type_into(driver, element_id.replace("_", "-"), value)


def send(driver, text):
    by_id(driver, "prompt").send_keys(text)
    by_id(driver, "send").click()


LAST_TURN = """
const turns = document.querySelectorAll('.turn.assistant');
const t = turns[turns.length - 1];
if (!t) return null;
const details = t.querySelector('details.reasoning');
return {state: t.dataset.state, n_turns: turns.length,
        content: t.querySelector('.content').textContent,
        reasoning: details.querySelector('.reasoning-text').textContent,
        reasoning_shown: !details.hidden, status: t.querySelector('.status').textContent};
"""


def last_turn(driver):
    return driver.execute_script(LAST_TURN)


def poll_until_done(driver, n_turns, timeout=120):
    """Polls the newest assistant turn until it is no longer streaming; returns the
    texts seen while streaming and the final turn."""
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = last_turn(driver)
        if t and t["n_turns"] == n_turns:
            if t["state"] != "streaming":
                return seen, t
            seen.append(t["content"])
        time.sleep(0.01)
    pytest.fail("the answer did not finish")


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def save_screenshot(driver, tmp_path):
    shot = tmp_path / "chat_page.png"
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = build_dir() / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, artifacts / "chat_page.png")


# ---- the page as served ----------------------------------------------------------------

def csp_hash(text):
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_page_is_the_file_with_its_headers(server):
    status, headers, body = http_get(server.base_url + "/")
    assert status == 200
    assert body == (REPO / "src/server/ui/chat.html").read_bytes()  # embedded byte for byte
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-cache"
    page = body.decode()
    assert not re.search(r"https?://", page), "the page must fetch nothing from elsewhere"
    # The CSP names the inline script and style by their SHA-256 (CSP Level 2), and
    # nothing else may load.
    csp = dict(d.strip().split(" ", 1) for d in headers["Content-Security-Policy"].split(";"))
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(scripts) == 1 and len(styles) == 1
    assert csp["script-src"] == csp_hash(scripts[0])
    assert csp["style-src"] == csp_hash(styles[0])
    assert csp["default-src"] == "'none'" and csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'"
    # Revalidation: the ETag (weak or strong, in a list) gives 304 with no body.
    etag = headers["ETag"]
    status, headers_304, body_304 = http_get(server.base_url + "/",
                                             {"If-None-Match": f'"other", W/{etag}'})
    assert status == 304 and body_304 == b"" and headers_304["ETag"] == etag
    assert http_get(server.base_url + "/", {"If-None-Match": '"other"'})[0] == 200


def test_disable_ui_makes_root_a_404(dserve_bin, default_model, tmp_path):
    with server_util.running(dserve_bin, default_model, *SERVER_ARGS, "--disable-ui",
                             log_path=tmp_path / "serve.log") as s:
        status, headers, body = http_get(s.base_url + "/")
        assert status == 404
        assert headers["Content-Type"] == "application/json"
        assert json.loads(body)["error"]["type"] == "not_found_error"
        assert http_get(s.base_url + "/v1/models")[0] == 200  # the API is unchanged


# ---- chatting ------------------------------------------------------------------------------

def test_streamed_answer_is_the_greedy_reply(browser, server, tmp_path):
    open_page(browser, server)
    assert wait_for_models(browser) == ["smollm2"]
    settings(browser, temperature=0, top_p=1, max_tokens=64)
    client = sdk(server)
    messages = []
    for n_turn, text in enumerate(["Tell me a story about a dragon.", "Now make it shorter."], 1):
        send(browser, text)
        seen, turn = poll_until_done(browser, n_turn)
        messages.append({"role": "user", "content": text})
        want = client.chat.completions.create(model="smollm2", messages=messages, temperature=0,
                                              top_p=1, max_tokens=64)
        reply = want.choices[0].message.content
        assert turn["state"] == "done"
        assert turn["content"] == reply
        assert not turn["reasoning_shown"]
        # Streamed: the text grew across polls, each a prefix of the final one.
        partial = {s for s in seen if 0 < len(s) < len(reply)}
        assert len(partial) >= 2, f"saw no growth while streaming: {seen}"
        assert all(reply.startswith(s) for s in seen)
        if want.choices[0].finish_reason == "length":
            assert turn["status"] == "Stopped at the token limit."
        messages.append({"role": "assistant", "content": reply})
    assert console_errors(browser) == []
    # Everything the page loaded came from the server itself.
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
    assert set(origins) <= {server.base_url}
    save_screenshot(browser, tmp_path)


def test_stop_ends_the_stream_and_frees_the_request(browser, server):
    open_page(browser, server)
    wait_for_models(browser)
    settings(browser, temperature=0, max_tokens=4000)
    aborted_before = metric(server, "vllm:request_success", finished_reason="abort")
    send(browser, "Count from 1 to 10000, one number per line.")
    wait_for("streamed text", lambda: len((last_turn(browser) or {}).get("content", "")) > 20)
    assert metric(server, "vllm:num_requests_running") == 1
    by_id(browser, "stop").click()
    stopped = wait_for("the stop", lambda: (t := last_turn(browser))["state"] == "stopped" and t)
    assert stopped["status"] == "Stopped."
    assert by_id(browser, "stop").get_attribute("disabled") is not None
    assert by_id(browser, "send").get_attribute("disabled") is None
    # The server cancels it: nothing running, one more request finished as aborted.
    wait_for("the server to free the request", lambda: (
        metric(server, "vllm:num_requests_running") == 0 and
        metric(server, "vllm:request_success", finished_reason="abort") == aborted_before + 1),
        timeout=15)
    time.sleep(1.0)
    assert last_turn(browser)["content"] == stopped["content"], "text grew after Stop"
    assert len(stopped["content"]) < 4000  # far from the token limit


def test_api_key(browser, dserve_bin, default_model, tmp_path):
    with server_util.running(dserve_bin, default_model, *SERVER_ARGS, "--api-key", API_KEY,
                             log_path=tmp_path / "serve.log") as s:
        assert http_get(s.base_url + "/")[0] == 200  # the page itself needs no key
        with pytest.raises(openai.AuthenticationError):
            sdk(s).models.list()
        open_page(browser, s)
        error = by_id(browser, "error")
        wait_for("the key request", lambda: AUTH_HINT in error.text)  # /v1/models got 401
        assert by_id(browser, "settings").is_displayed()
        # A message without the key: the same clear request, and the message comes back
        # to the prompt box to send again.
        browser.execute_script("document.getElementById('error').hidden = true")
        send(browser, "Name three colours.")
        wait_for("the 401 message", lambda: error.is_displayed() and AUTH_HINT in error.text)
        wait_for("the request to end", lambda: browser.execute_script(
            "return document.body.dataset.busy === 'false'"))
        assert last_turn(browser) is None
        assert by_id(browser, "prompt").get_attribute("value") == "Name three colours."
        # With the key: the models load, the message goes through.
        settings(browser, temperature=0, max_tokens=24, api_key=API_KEY)
        assert wait_for_models(browser) == ["smollm2"]
        assert not error.is_displayed()
        by_id(browser, "send").click()
        _, turn = poll_until_done(browser, 1)
        want = sdk(s, API_KEY).chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Name three colours."}],
            temperature=0, max_tokens=24)
        assert turn["state"] == "done" and turn["content"] == want.choices[0].message.content
        # The key is kept in localStorage: a reload works without typing it again.
        assert browser.execute_script(
            "return localStorage.getItem('dserve.chat.api-key')") == API_KEY
        browser.refresh()
        assert wait_for_models(browser) == ["smollm2"]
        assert not by_id(browser, "error").is_displayed()


# ---- R1 reasoning -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def r1_server(dserve_bin, tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_server_reasoning import r1_checkpoint
    log = tmp_path_factory.mktemp("chat-page-r1") / "serve.log"
    with server_util.running(dserve_bin, r1_checkpoint(), "--reasoning-parser", "deepseek_r1",
                             "--served-model-name", "r1-tiny", "--threads", 2,
                             "--kv-cache-memory", 64 << 20, log_path=log) as s:
        yield s


def test_reasoning_is_shown_apart(browser, r1_server):
    open_page(browser, r1_server)
    assert wait_for_models(browser) == ["r1-tiny"]
    settings(browser, temperature=0, max_tokens=32)
    send(browser, "2+2?")
    _, turn = poll_until_done(browser, 1)
    want = sdk(r1_server).chat.completions.create(
        model="r1-tiny", messages=[{"role": "user", "content": "2+2?"}], temperature=0,
        max_tokens=32).choices[0].message
    assert want.reasoning_content and want.content  # the reference does split
    assert turn["state"] == "done"
    assert turn["reasoning_shown"] and turn["reasoning"] == want.reasoning_content
    assert turn["content"] == want.content
    # The reasoning block is collapsible and folded once the answer began.
    assert browser.execute_script(
        "return document.querySelector('.turn.assistant details.reasoning').open") is False
