// Calls to the API: the key (asked for once after a 401, kept in sessionStorage), and errors in words.

import { t } from "./i18n.js";

const KEY_STORAGE = "rag.apiKey";

let askKey = async () => null; // set by the page: shows the key dialog, resolves to the key or null
let pendingAsk = null;

export function setKeyPrompt(prompt) {
  askKey = prompt;
}

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function saveKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

export function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// One dialog for all the requests that got a 401 at the same moment. `sentKey`: the key that was refused.
export async function keyAfter401(sentKey) {
  const message = sentKey ? t("key.refused") : t("key.needed");
  pendingAsk ??= askKey(message).finally(() => { pendingAsk = null; });
  const key = await pendingAsk;
  if (key) saveKey(key);
  return key;
}

export class ApiError extends Error {
  constructor(status, code, message, detail) {
    super(message);
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

// fetch() with the key; after a 401 it asks for the key and tries again, until the user gives up.
export async function apiFetch(path, options = {}) {
  for (;;) {
    const sentKey = apiKey();
    const headers = { ...(options.headers || {}), ...authHeaders() };
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401) return response;
    const error = await errorFrom(response);
    if (!(await keyAfter401(sentKey))) throw error;
  }
}

export async function apiJson(path, options = {}) {
  const response = await apiFetch(path, options);
  if (!response.ok) throw await errorFrom(response);
  return response.status === 204 ? null : response.json();
}

// The API's JSON error body {"error": {code, message, detail}}, or the bare status when there is none.
export async function errorFrom(response) {
  const text = await response.text().catch(() => "");
  return errorFromBody(response.status, text, response.statusText);
}

export function errorFromBody(status, text, statusText = "") {
  try {
    const { error } = JSON.parse(text);
    if (error && error.message) return new ApiError(status, error.code, error.message, error.detail);
  } catch (_) {
    // not JSON: a proxy's page or an empty body
  }
  return new ApiError(status, "http_error", statusText || t("error.http", { status }));
}

// The error codes with a lead of their own in the locale files ("error.lead.<code>").
const LEADS = new Set([
  "unauthorized", "busy", "llm_unavailable", "embedder_unavailable", "store_unavailable", "backend_unavailable",
  "question_too_long", "exceed_context_size", "too_large", "unsupported_file_type", "document_rejected", "not_found",
]);

// One sentence for the user: a lead in the page's language for the known codes, the API's own message
// (in its words), the status; one locale message holds them all, so each language orders them its way.
export function describeError(error) {
  if (error instanceof TypeError) return t("error.network");
  if (!(error instanceof ApiError)) return String(error && error.message ? error.message : error);
  let lead = LEADS.has(error.code) ? t(`error.lead.${error.code}`) : null;
  if (lead && error.message.toLowerCase().startsWith(lead.toLowerCase())) lead = null; // said already
  const message = error.message.replace(/[.。]\s*$/, "");
  const key = `error.${lead ? "lead" : "plain"}${error.status ? "Status" : ""}`;
  const sentence = t(key, { lead, message, status: error.status });
  const seconds = error.code === "busy" && error.detail && error.detail.retry_after;
  return seconds ? t("error.withRetry", { error: sentence, seconds }) : sentence;
}
