"""The page at /, in a real headless browser (Debian's chromium and chromium-driver, driven by selenium):
languages load, a sentence typed and translated shows the API's translation and its alternatives, auto names the
language, swap swaps, an alternative chosen replaces the translation, the character count follows the text, copy
copies, a link restores the state, a .docx uploaded comes back translated."""

from __future__ import annotations

import io
import os
import shutil
import urllib.parse
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
ENGLISH = "A man is walking."
ALTERNATIVES = 3  # as many as the page asks for (LibreTranslate's page asks for as many)
WAIT_S = 30
# Headless, as root in a sandbox, and with no calls of its own to the network (there is none to call).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"] + [
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,700",
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


def open_page(site: RunningServer, browser, address: str = "/"):
    """The page at ``address``, once it has loaded the languages and settings; a wait for what comes next."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get("about:blank")  # a new document, even where only the fragment differs from the last one
    browser.get(f"http://127.0.0.1:{site.server.http_port}{address}")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true")
    return wait


def translate_on_page(site: RunningServer, browser, text: str, source: str, target: str):
    """Types ``text``, picks the languages and translates; a wait, once the translation shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    wait = open_page(site, browser)
    Select(browser.find_element(By.ID, "source")).select_by_value(source)
    Select(browser.find_element(By.ID, "target")).select_by_value(target)
    browser.find_element(By.ID, "text").send_keys(text)
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: "confidence" in d.find_element(By.ID, "status").text)
    return wait


def shown_alternatives(browser) -> list[str]:
    from selenium.webdriver.common.by import By

    return [b.text for b in browser.find_elements(By.CSS_SELECTOR, "#alternative-list button")]


def test_typing_a_sentence_and_translating_it_shows_the_apis_translation(site: RunningServer, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    wait = open_page(site, browser)
    source, target = Select(browser.find_element(By.ID, "source")), Select(browser.find_element(By.ID, "target"))
    assert [o.get_attribute("value") for o in source.options] == ["auto", "en", "de"]
    assert source.first_selected_option.get_attribute("value") == "auto"
    browser.find_element(By.ID, "text").send_keys(GERMAN)
    target.select_by_value("en")
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: "confidence" in d.find_element(By.ID, "status").text)
    shown = browser.find_element(By.ID, "translation").text
    asked = {"q": GERMAN, "source": "de", "target": "en", "alternatives": ALTERNATIVES}
    _, _, expected = http(site, "/translate", asked)
    assert shown == expected["translatedText"].strip() and shown
    assert shown_alternatives(browser) == [a.strip() for a in expected["alternatives"]]
    assert "detected de" in browser.find_element(By.ID, "status").text
    screenshot = Path(os.environ.get("PAGE_SCREENSHOT", tmp_path / "page.png"))
    assert browser.save_screenshot(str(screenshot)) and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    source.select_by_value("de")
    browser.find_element(By.ID, "swap").click()
    assert Select(browser.find_element(By.ID, "source")).first_selected_option.get_attribute("value") == "en"
    assert browser.find_element(By.ID, "text").get_attribute("value") == shown


def test_choosing_an_alternative_replaces_the_translation(site: RunningServer, browser):
    from selenium.webdriver.common.by import By

    translate_on_page(site, browser, ENGLISH, "en", "de")
    first, offered = browser.find_element(By.ID, "translation").text, shown_alternatives(browser)
    assert offered, "the server offered no alternative"
    browser.find_element(By.CSS_SELECTOR, "#alternative-list li:first-child button").click()
    assert browser.find_element(By.ID, "translation").text == offered[0]
    assert shown_alternatives(browser) == [first, *offered[1:]]  # the translation it replaced is offered instead


def test_the_character_count_follows_the_text_against_the_servers_limit(site: RunningServer, browser):
    from selenium.webdriver.common.by import By

    _, _, settings = http(site, "/frontend/settings")
    limit = settings["charLimit"]
    assert limit > 0, "the server's default --char-limit is a limit"
    open_page(site, browser)
    counter = browser.find_element(By.ID, "char-count")
    assert counter.text == f"0 / {limit}"
    browser.find_element(By.ID, "text").send_keys("Schnee ❄")  # 8 characters, one of them outside the BMP
    assert counter.text == f"8 / {limit}" and "over" not in counter.get_attribute("class")
    box = browser.find_element(By.ID, "text")
    browser.execute_script(
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))", box, "x" * (limit + 1)
    )
    assert counter.text == f"{limit + 1} / {limit}" and "over" in counter.get_attribute("class")


def test_copy_puts_the_translation_on_the_clipboard(site: RunningServer, browser):
    from selenium.webdriver.common.by import By

    origin = f"http://127.0.0.1:{site.server.http_port}"
    permissions = ["clipboardReadWrite", "clipboardSanitizedWrite"]
    browser.execute_cdp_cmd("Browser.grantPermissions", {"origin": origin, "permissions": permissions})
    wait = translate_on_page(site, browser, ENGLISH, "en", "de")
    shown = browser.find_element(By.ID, "translation").text
    browser.find_element(By.ID, "copy").click()
    wait.until(lambda d: d.find_element(By.ID, "status").text == "copied")
    read = "navigator.clipboard.readText().then(arguments[0], (e) => arguments[0](String(e)))"
    assert browser.execute_async_script(read) == shown


def test_copy_without_the_clipboard_api_selects_the_translation(site: RunningServer, browser):
    from selenium.webdriver.common.by import By

    wait = translate_on_page(site, browser, ENGLISH, "en", "de")
    shown = browser.find_element(By.ID, "translation").text
    browser.execute_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")  # as over HTTP
    browser.find_element(By.ID, "copy").click()
    wait.until(lambda d: d.find_element(By.ID, "status").text in ("copied", "selected: press Ctrl+C to copy"))
    assert browser.execute_script("return getSelection().toString()") == shown


def test_a_link_to_a_translation_reproduces_it(site: RunningServer, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    translate_on_page(site, browser, ENGLISH, "en", "de")
    shown = browser.find_element(By.ID, "translation").text
    link = urllib.parse.urlsplit(browser.current_url)
    assert urllib.parse.parse_qs(link.fragment) == {"source": ["en"], "target": ["de"], "q": [ENGLISH]}
    # the fragment (ours) and the query (LibreTranslate's links, its codes in any case) both restore the state
    for address in (
        f"/#{link.fragment}",
        "/?" + urllib.parse.urlencode({"source": "EN", "target": "de", "q": ENGLISH}),
    ):
        wait = open_page(site, browser, address)
        wait.until(lambda d: "confidence" in d.find_element(By.ID, "status").text)
        assert Select(browser.find_element(By.ID, "source")).first_selected_option.get_attribute("value") == "en"
        assert Select(browser.find_element(By.ID, "target")).first_selected_option.get_attribute("value") == "de"
        assert browser.find_element(By.ID, "text").get_attribute("value") == ENGLISH
        assert browser.find_element(By.ID, "translation").text == shown


def test_a_word_document_uploaded_comes_back_translated(site: RunningServer, browser, tmp_path):
    docx = pytest.importorskip("docx", reason="python-docx (the files extra) not installed")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    document = docx.Document()
    for text in ("A man is walking.", "A dog runs."):
        document.add_paragraph(text)
    path = tmp_path / "letter.docx"
    document.save(path)
    wait = open_page(site, browser)
    Select(browser.find_element(By.ID, "source")).select_by_value("en")
    browser.find_element(By.ID, "file").send_keys(str(path))
    browser.find_element(By.ID, "translate-file").click()
    wait.until(lambda d: d.find_element(By.ID, "download").is_displayed())
    link = browser.find_element(By.ID, "download").get_attribute("href")
    with urllib.request.urlopen(link, timeout=30) as response:
        back = docx.Document(io.BytesIO(response.read()))
    # a file's paragraphs come back as the model wrote them, as LibreTranslate's do: no mirrored formatting
    asked = {"q": ["A man is walking.", "A dog runs."], "source": "en", "target": "de", "mirror_formatting": False}
    _, _, expected = http(site, "/translate", asked)
    assert [p.text for p in back.paragraphs] == expected["translatedText"]


def test_an_error_shows_the_apis_message(site: RunningServer, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    wait = open_page(site, browser)
    Select(browser.find_element(By.ID, "source")).select_by_value("en")
    browser.find_element(By.ID, "translate").click()  # nothing typed
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("400"))
    assert "missing q" in browser.find_element(By.ID, "status").text


def test_the_glossary_box_sends_its_lines_and_shows_what_was_applied(site: RunningServer, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    wait = open_page(site, browser)
    browser.find_element(By.CSS_SELECTOR, "#glossary-box summary").click()
    browser.find_element(By.ID, "glossary").send_keys("man=Kerl\nnot a line\n")
    Select(browser.find_element(By.ID, "source")).select_by_value("en")
    Select(browser.find_element(By.ID, "target")).select_by_value("de")
    browser.find_element(By.ID, "text").send_keys(ENGLISH)
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda d: "confidence" in d.find_element(By.ID, "status").text)
    assert "Kerl" in browser.find_element(By.ID, "translation").text
    assert "glossary: man ×1" in browser.find_element(By.ID, "status").text
