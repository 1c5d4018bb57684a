"""The audit viewer in a real browser: Debian's headless Chromium driven by Playwright.

The service runs on uvicorn (loopback) with scripted models; the test submits a job through the
page, watches step 1 appear while the job is held, releases it, and checks the finished view:
timeline lanes, step cards, the answer with evidence links, and that every thumbnail decoded
(`naturalWidth > 0`). Every request the page makes is recorded: all must go to the service's own
origin. A case file written by `medclaw trace html` is then opened from disk with the network
cut off. Screenshots are kept in artifacts/ (git-ignored). `make system-deps` installs chromium;
without it (or without the playwright package) these tests skip, saying so.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.server.conftest import EVIDENCE, QUESTION, wait_for

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
ALL_THUMBS_DECODED = """() => {
  const imgs = [...document.querySelectorAll('img.thumb')];
  return imgs.length > 0 && imgs.every((img) => img.complete && img.naturalWidth > 0);
}"""


def chromium_path() -> str | None:
    for candidate in (shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (`make system-deps` installs it)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS,
                                             headless=True)
        yield browser
        browser.close()


def watch(page) -> tuple[list[str], list[str]]:
    """Record every request URL and every console error / uncaught exception of `page`."""
    requests, errors = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda response: errors.append(f"{response.status} {response.url}")
            if response.status >= 400 else None)
    return requests, errors


def test_the_viewer_submits_a_job_shows_steps_live_and_renders_every_thumbnail(
        browser, make_service, live_server, video_root):
    service = make_service(hold_at=1)              # step 1 completes, then the job waits
    base = live_server(service)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    requests, errors = watch(page)
    page.goto(f"{base}/#token={service.token}")
    page.wait_for_selector("#app:not([hidden])")
    assert service.token not in page.url           # taken out of the address bar

    page.fill("#question", QUESTION)
    page.fill("#video-path", str(video_root / "case.mp4"))
    page.click("#submit-button")
    page.wait_for_selector("#steps article[data-step='1']", timeout=30_000)
    assert page.text_content("#status") == "running"
    assert page.locator("#steps article").count() == 1          # live: only the step done so far
    page.wait_for_function(ALL_THUMBS_DECODED, timeout=30_000)  # its thumbnails, while running
    assert page.locator("#timeline .lane[data-step]").count() == 1

    service.orchestrator.release.set()
    page.wait_for_selector("#answer .answer-text", timeout=30_000)
    assert page.text_content("#answer .answer-text") == "scissors"
    assert page.text_content("#status") == "done"
    assert page.locator("#steps article").count() == 3
    assert page.locator("#timeline .lane[data-step]").count() == 3
    assert page.locator("#timeline .window.inspected").count() >= 2      # whole video, zoomed frame
    assert page.locator("#timeline .evidence-mark").count() == len(EVIDENCE)
    page.wait_for_function(ALL_THUMBS_DECODED, timeout=30_000)
    thumbs = page.locator("img.thumb").count()
    assert thumbs >= 10
    assert page.locator(".zoom-box").count() == 1 and page.locator("img.zoomed").count() == 1

    links = page.locator("a.evidence-link")
    assert links.count() == len(EVIDENCE)
    links.first.click()
    wait_for(lambda: page.locator("figure.frame.highlight").count() == 1, timeout=10)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "test-viewer.png"), full_page=True)

    # the page talked to its own origin only (thumbnails arrive as blob: URLs made from its fetches)
    foreign = [u for u in requests if not (u.startswith(base + "/") or u.startswith(f"blob:{base}/")
                                           or u.startswith("data:"))]
    assert requests and not foreign, foreign
    assert any("/api/jobs/" in u and "/frames/" in u for u in requests)
    assert not errors, errors
    page.close()


def test_the_case_file_opens_offline_with_every_evidence_frame(browser, make_service, client_for,
                                                                tmp_path):
    from medclaw.cli import main

    service = make_service()
    client = client_for(service)
    job = client.post("/api/jobs", headers=service.auth,
                      json={"question": QUESTION, "video": str(service.roots[0] / "case.mp4")}).json()
    done = wait_for(lambda: (j := client.get(f"/api/jobs/{job['id']}", headers=service.auth).json())
                    ["status"] == "done" and j)
    view = client.get(f"/api/jobs/{job['id']}/view", headers=service.auth).json()["view"]
    shown = {f["key"] for s in view["steps"] for f in s["frames"] if f["shown"]}
    out = tmp_path / "case.html"
    assert main(["trace", "html", done["trace_path"], "--out", str(out)]) == 0

    context = browser.new_context(offline=True)
    blocked = []
    context.route("**/*", lambda route: (route.continue_() if route.request.url.startswith(("file:", "data:"))
                                         else (blocked.append(route.request.url), route.abort())))
    page = context.new_page()
    requests, errors = watch(page)
    page.goto(out.as_uri())
    page.wait_for_function(ALL_THUMBS_DECODED, timeout=30_000)
    assert page.text_content(".answer-text") == "scissors"
    keys = set(page.eval_on_selector_all("figure.frame", "els => els.map(e => e.dataset.key)"))
    assert keys == shown                                        # every evidence frame shown
    assert page.locator("#timeline .lane[data-step]").count() == 3
    page.screenshot(path=str(ARTIFACTS / "test-case-html.png"), full_page=True)
    assert not blocked and not errors, (blocked, errors)
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    context.close()


def test_model_text_is_shown_as_text_never_run(browser, tmp_path, video_root):
    from medclaw.server.export import write_case_html
    from tests.server.conftest import run_scripted_episode
    from tests.server.test_view_export import HOSTILE, hostile_orchestrator

    trace = run_scripted_episode(tmp_path, video_root / "case.mp4", hostile_orchestrator)
    out = write_case_html(trace, tmp_path / "hostile.html")
    page = browser.new_page()
    requests, errors = watch(page)
    page.goto(out.as_uri())
    page.wait_for_function(ALL_THUMBS_DECODED, timeout=30_000)
    assert page.text_content(".answer-text") == HOSTILE
    assert page.text_content(".thought") == HOSTILE
    assert page.title() != "pwned" and page.locator("img[src=x]").count() == 0
    assert not errors and all(u.startswith(("file:", "data:")) for u in requests)
    page.close()


def test_the_page_asks_for_the_token_and_refuses_a_wrong_one(browser, make_service, live_server):
    service = make_service()
    base = live_server(service)
    page = browser.new_page()
    page.goto(base + "/")
    page.wait_for_selector("#login:not([hidden])")
    assert page.locator("#app").is_hidden()
    page.fill("#token-input", "not-the-token")
    page.click("#login-form button")
    page.wait_for_selector("#notice.error")
    assert "refused" in page.text_content("#notice") and page.locator("#app").is_hidden()
    page.fill("#token-input", service.token)
    page.click("#login-form button")
    page.wait_for_selector("#app:not([hidden])")
    assert page.locator("#profile option").all_text_contents() == ["tiny-cpu"]
    page.close()
