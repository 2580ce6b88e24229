// The page at /: the server's own HTTP API (/languages, /frontend/settings, /translate), nothing else.
"use strict";

const $ = (id) => document.getElementById(id);
let languages = []; // [{code, name, targets}] from /languages

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
  const [listed, settings] = await Promise.all([
    fetch("/languages").then((r) => r.json()),
    fetch("/frontend/settings").then((r) => r.json()),
  ]);
  languages = listed;
  const sources = languages.map((l) => option(l.code, l.name));
  if (settings.language.source.code === "auto") sources.unshift(option("auto", "Auto Detect"));
  $("source").replaceChildren(...sources);
  $("source").value = settings.language.source.code;
  fillTargets(settings.language.target.code);
  $("key-label").hidden = !settings.apiKeys;
  document.body.dataset.ready = "true";
}

function swap() {
  const source = $("source").value;
  const target = $("target").value;
  if (!languages.some((l) => l.code === target)) return; // the target is no source here
  $("source").value = target;
  fillTargets(source === "auto" ? undefined : source);
  if ($("translation").value) $("text").value = $("translation").value;
}

async function translate(event) {
  event.preventDefault();
  const body = {
    q: $("text").value,
    source: $("source").value,
    target: $("target").value,
    format: $("format").value,
  };
  if ($("api-key").value) body.api_key = $("api-key").value;
  $("status").textContent = "translating…";
  try {
    const response = await fetch("/translate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const answer = await response.json();
    if (!response.ok) {
      $("translation").value = "";
      $("status").textContent = `${response.status}: ${answer.error}`;
      return;
    }
    $("translation").value = answer.translatedText;
    // confidence is the mean token log-probability; exp() is the geometric-mean token probability
    const parts = [`confidence ${Math.round(100 * Math.exp(answer.confidence))}%`];
    if (answer.detectedLanguage) parts.push(`detected ${answer.detectedLanguage.language}`);
    if (answer.flags && answer.flags.length) parts.push(`flags: ${answer.flags.join(", ")}`);
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
  $("translate-form").addEventListener("submit", translate);
  $("translate-file").addEventListener("click", translateFile);
  load().catch((error) => { $("status").textContent = `cannot load the languages (${error})`; });
});
