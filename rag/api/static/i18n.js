// The page's strings, from one locale file per language (static/locales/<lang>.json), chosen by the
// switch in the top bar (remembered in localStorage), else by the server's RAG_LANGUAGE, else by the
// browser's languages.
//
// A message is one whole sentence or label with {name} placeholders, filled by t(): translated pieces
// are never glued together, since word order differs between languages. A message that depends on a
// number is an object of plural forms ({"one": ..., "other": ...}) chosen by its `count` parameter with
// Intl.PluralRules (Chinese has the one form "other"). A key missing from a locale falls back to English.

export const LANGUAGES = { en: "English", "zh-CN": "中文" }; // each named in its own language
const STORAGE = "rag.language";

let lang = "en";
let messages = {};
let fallback = {};

export function language() {
  return lang;
}

// The saved choice, else the server's default (RAG_LANGUAGE, `rag up --lang`, set on <html> by the
// server), else the first of the browser's languages that the page speaks, else English.
export function preferredLanguage() {
  const saved = localStorage.getItem(STORAGE);
  if (saved && saved in LANGUAGES) return saved;
  const server = document.documentElement.dataset.defaultLanguage;
  if (server && server in LANGUAGES) return server;
  for (const wanted of navigator.languages || [navigator.language || "en"]) {
    if (/^zh\b/i.test(wanted)) return "zh-CN";
    if (/^en\b/i.test(wanted)) return "en";
  }
  return "en";
}

async function fetchLocale(name) {
  const response = await fetch(`/static/locales/${name}.json`);
  if (!response.ok) throw new Error(`locale ${name}: HTTP ${response.status}`);
  return response.json();
}

// Load a language and apply it to the page's static text.
export async function useLanguage(name) {
  const [own, english] = await Promise.all([fetchLocale(name), name === "en" ? null : fetchLocale("en")]);
  messages = own;
  fallback = english || own;
  lang = name;
  document.documentElement.lang = name;
  applyPage();
}

// The switch's choice: remembered for the next visit.
export function chooseLanguage(name) {
  localStorage.setItem(STORAGE, name);
  return useLanguage(name);
}

export function t(key, params = {}) {
  let message = messages[key] ?? fallback[key] ?? key;
  if (typeof message === "object") {
    message = message[new Intl.PluralRules(lang).select(Number(params.count ?? 0))] ?? message.other;
  }
  return message.replace(/\{(\w+)\}/g, (whole, name) => (name in params ? String(params[name]) : whole));
}

// The message of `key` when a locale has one, else `otherwise` (an API value with no message of its own).
export function known(key, otherwise) {
  return key in messages || key in fallback ? t(key) : otherwise;
}

export function formatNumber(n) {
  return Number(n || 0).toLocaleString(lang);
}

// index.html's own text: data-i18n="key" sets an element's text, data-i18n-<attribute>="key" that attribute.
export function applyPage(root = document) {
  for (const node of root.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
  for (const attribute of ["placeholder", "aria-label", "title"]) {
    for (const node of root.querySelectorAll(`[data-i18n-${attribute}]`)) {
      node.setAttribute(attribute, t(node.getAttribute(`data-i18n-${attribute}`)));
    }
  }
  document.title = t("page.title");
}
