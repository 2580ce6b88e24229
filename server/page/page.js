// The page at /: the server's own HTTP API (/languages, /frontend/settings, /spec, /translate), nothing else.
"use strict";

const $ = (id) => document.getElementById(id);
const ALTERNATIVES = 3; // as many as LibreTranslate's page asks for
let languages = []; // [{code, name, targets}] from /languages
let charLimit = -1; // /frontend/settings' charLimit; -1: none
let alternatives = 0; // ALTERNATIVES, within what /spec says the server allows (its max_beam_size - 1)

function option(code, name) {
  const element = document.createElement("option");
  element.value = code;
  element.textContent = name;
  return element;
}

function fillTargets(wanted) {
  const source = $("source").value;
  const codes = source === "auto"
    ? [...new Set(languages.flatMap((l) => l.targets))]
    : (languages.find((l) => l.code === source) || { targets: [] }).targets;
  const names = Object.fromEntries(languages.map((l) => [l.code, l.name]));
  $("target").replaceChildren(...codes.map((code) => option(code, names[code] || code)));
  if (wanted && codes.includes(wanted)) $("target").value = wanted;
}

async function load() {
  const [listed, settings, spec] = await Promise.all([
    fetch("/languages").then((r) => r.json()),
    fetch("/frontend/settings").then((r) => r.json()),
    fetch("/spec").then((r) => r.json()),
  ]);
  languages = listed;
  const sources = languages.map((l) => option(l.code, l.name));
  if (settings.language.source.code === "auto") sources.unshift(option("auto", "Auto Detect"));
  $("source").replaceChildren(...sources);
  $("source").value = settings.language.source.code;
  fillTargets(settings.language.target.code);
  $("key-label").hidden = !settings.apiKeys;
  $("file").accept = settings.supportedFilesFormat.join(",");
  charLimit = settings.charLimit ?? -1;
  const asked = spec.components.schemas.TranslateRequest.properties.alternatives;
  alternatives = Math.min(ALTERNATIVES, asked ? asked.maximum : 0);
  const restored = restore();
  countCharacters();
  document.body.dataset.ready = "true";
  if (restored) $("translate-form").requestSubmit();
}

// The state travels in the fragment (#source=de&target=en&q=...), which never reaches the server, so a link to
// a long text works too; LibreTranslate's links (?source=de&target=en&q=...) open here as well.
function restore() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const query = new URLSearchParams(location.search);
  const get = (name) => fragment.get(name) ?? query.get(name);
  const source = (get("source") || "").toLowerCase();
  const target = (get("target") || $("target").value).toLowerCase();
  if ([...$("source").options].some((o) => o.value === source)) $("source").value = source;
  fillTargets(target);
  if (["text", "html"].includes(get("format"))) $("format").value = get("format");
  const text = get("q");
  if (text !== null) $("text").value = text;
  return Boolean(text);
}

function remember() {
  const state = new URLSearchParams({ source: $("source").value, target: $("target").value });
  if ($("format").value !== "text") state.set("format", $("format").value);
  state.set("q", $("text").value);
  history.replaceState(null, "", `${location.pathname}#${state}`);
}

function countCharacters() {
  const count = [...$("text").value].length; // code points, as the server counts them
  const counter = $("char-count");
  counter.textContent = charLimit >= 0 ? `${count} / ${charLimit}` : `${count}`;
  counter.classList.toggle("over", charLimit >= 0 && count > charLimit);
  counter.title = charLimit >= 0 ? "characters, and the server's limit per request" : "characters";
}

// The translation and the others the server offered; choosing one swaps it with the translation.
function show(translation, others) {
  $("translation").value = translation;
  $("copy").disabled = !translation;
  const items = others.map((other, index) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = other;
    button.addEventListener("click", () => show(other, others.map((o, i) => (i === index ? translation : o))));
    const item = document.createElement("li");
    item.append(button);
    return item;
  });
  $("alternative-list").replaceChildren(...items);
  $("alternatives").hidden = !items.length;
}

async function copy() {
  const text = $("translation").value;
  try {
    await navigator.clipboard.writeText(text);
    $("status").textContent = "copied";
  } catch {
    // no clipboard API (a page not served over HTTPS or from localhost) or no permission: select and copy
    const range = document.createRange();
    range.selectNodeContents($("translation").firstChild); // its text: a block's own range adds a line break
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    $("status").textContent = document.execCommand("copy") ? "copied" : "selected: press Ctrl+C to copy";
  }
}

function swap() {
  const source = $("source").value;
  const target = $("target").value;
  if (!languages.some((l) => l.code === target)) return; // the target is no source here
  $("source").value = target;
  fillTargets(source === "auto" ? undefined : source);
  if ($("translation").value) {
    $("text").value = $("translation").value;
    show("", []); // its alternatives were the other way round
  }
  countCharacters();
}

// The glossary box's "source=target" lines as the API's glossary object; lines without "=" are left out
function glossaryEntries() {
  const entries = {};
  for (const line of $("glossary").value.split("\n")) {
    const at = line.indexOf("=");
    if (at > 0 && line.slice(0, at).trim() && line.slice(at + 1).trim()) {
      entries[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
  }
  return entries;
}

async function translate(event) {
  event.preventDefault();
  const body = {
    q: $("text").value,
    source: $("source").value,
    target: $("target").value,
    format: $("format").value,
  };
  if (alternatives) body.alternatives = alternatives;
  if ($("api-key").value) body.api_key = $("api-key").value;
  const glossary = glossaryEntries();
  if (Object.keys(glossary).length) body.glossary = glossary;
  $("status").textContent = "translating…";
  try {
    const response = await fetch("/translate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const answer = await response.json();
    if (!response.ok) {
      show("", []);
      $("status").textContent = `${response.status}: ${answer.error}`;
      return;
    }
    show(answer.translatedText, answer.alternatives || []);
    remember();
    // confidence is the mean token log-probability; exp() is the geometric-mean token probability
    const parts = [`confidence ${Math.round(100 * Math.exp(answer.confidence))}%`];
    if (answer.detectedLanguage) parts.push(`detected ${answer.detectedLanguage.language}`);
    if (answer.flags && answer.flags.length) parts.push(`flags: ${answer.flags.join(", ")}`);
    if (answer.glossaryApplied) {
      const applied = Object.entries(answer.glossaryApplied).map(([term, times]) => `${term} ×${times}`);
      parts.push(`glossary: ${applied.join(", ") || "no term found"}`);
    }
    $("status").textContent = parts.join(" · ");
  } catch (error) {
    $("status").textContent = `the server did not answer (${error})`;
  }
}

async function translateFile() {
  const file = $("file").files[0];
  if (!file) {
    $("status").textContent = "choose a file first";
    return;
  }
  const form = new FormData();
  form.append("file", file);
  form.append("source", $("source").value);
  form.append("target", $("target").value);
  if ($("api-key").value) form.append("api_key", $("api-key").value);
  $("download").hidden = true;
  $("status").textContent = `translating ${file.name}…`;
  try {
    const response = await fetch("/translate_file", { method: "POST", body: form });
    const answer = await response.json();
    if (!response.ok) {
      $("status").textContent = `${response.status}: ${answer.error}`;
      return;
    }
    $("download").href = answer.translatedFileUrl;
    $("download").textContent = `download ${file.name} (once)`;
    $("download").hidden = false;
    $("status").textContent = `${file.name} translated`;
  } catch (error) {
    $("status").textContent = `the server did not answer (${error})`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("source").addEventListener("change", () => fillTargets($("target").value));
  $("swap").addEventListener("click", swap);
  $("text").addEventListener("input", countCharacters);
  $("copy").addEventListener("click", copy);
  $("translate-form").addEventListener("submit", translate);
  $("translate-file").addEventListener("click", translateFile);
  load().catch((error) => { $("status").textContent = `cannot load the languages (${error})`; });
});
