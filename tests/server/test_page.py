"""The page at /, in a real headless browser (Debian's chromium and chromium-driver, driven by selenium):
languages load, a sentence typed and translated shows the API's translation, auto names the language, swap swaps,
a .docx uploaded comes back translated."""

from __future__ import annotations

import io
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.servers import RunningServer, free_port, http, server_config

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium and chromedriver not installed (Debian chromium chromium-driver; .ci/run installs them)",
)
GERMAN = "Zwei Hunde spielen im Schnee."
WAIT_S = 30
# Headless, as root in a sandbox, and with no calls of its own to the network (there is none to call).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"] + [
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1100,700",
]


@pytest.fixture(scope="module")
def site(tiny_export: Path, tiny_reverse_export: Path) -> Iterator[RunningServer]:
    """Both tiny models; PAGE_MODELS=DIR,DIR serves others (the screenshot in docs/ is of the default models)."""
    models = tuple(Path(m) for m in os.environ["PAGE_MODELS"].split(",")) if "PAGE_MODELS" in os.environ else None
    models = models or (tiny_export, tiny_reverse_export)
    server = RunningServer(server_config(models, http_port=free_port(), max_output_tokens=32))
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_typing_a_sentence_and_translating_it_shows_the_apis_translation(site: RunningServer, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser.get(f"http://127.0.0.1:{site.server.http_port}/")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    source, target = Select(browser.find_element(By.ID, "source")), Select(browser.find_element(By.ID, "target"))
    assert [o.get_attribute("value") for o in source.options] == ["auto", "en", "de"]
    assert source.first_selected_option.get_attribute("value") == "auto"
    browser.find_element(By.ID, "text").send_keys(GERMAN)
    target.select_by_value("en")
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: "confidence" in d.find_element(By.ID, "status").text)
    shown = browser.find_element(By.ID, "translation").text
    _, _, expected = http(site, "/translate", {"q": GERMAN, "source": "de", "target": "en"})
    assert shown == expected["translatedText"].strip() and shown
    assert "detected de" in browser.find_element(By.ID, "status").text
    screenshot = Path(os.environ.get("PAGE_SCREENSHOT", tmp_path / "page.png"))
    assert browser.save_screenshot(str(screenshot)) and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    source.select_by_value("de")
    browser.find_element(By.ID, "swap").click()
    assert Select(browser.find_element(By.ID, "source")).first_selected_option.get_attribute("value") == "en"
    assert browser.find_element(By.ID, "text").get_attribute("value") == shown


def test_a_word_document_uploaded_comes_back_translated(site: RunningServer, browser, tmp_path):
    docx = pytest.importorskip("docx", reason="python-docx (the files extra) not installed")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    document = docx.Document()
    for text in ("A man is walking.", "A dog runs."):
        document.add_paragraph(text)
    path = tmp_path / "letter.docx"
    document.save(path)
    browser.get(f"http://127.0.0.1:{site.server.http_port}/")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    Select(browser.find_element(By.ID, "source")).select_by_value("en")
    browser.find_element(By.ID, "file").send_keys(str(path))
    browser.find_element(By.ID, "translate-file").click()
    wait.until(lambda d: d.find_element(By.ID, "download").is_displayed())
    link = browser.find_element(By.ID, "download").get_attribute("href")
    with urllib.request.urlopen(link, timeout=30) as response:
        back = docx.Document(io.BytesIO(response.read()))
    _, _, expected = http(
        site, "/translate", {"q": ["A man is walking.", "A dog runs."], "source": "en", "target": "de"}
    )
    assert [p.text for p in back.paragraphs] == expected["translatedText"]


def test_an_error_shows_the_apis_message(site: RunningServer, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser.get(f"http://127.0.0.1:{site.server.http_port}/")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    Select(browser.find_element(By.ID, "source")).select_by_value("en")
    browser.find_element(By.ID, "translate").click()  # nothing typed
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("400"))
    assert "missing q" in browser.find_element(By.ID, "status").text
