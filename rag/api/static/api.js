// Calls to the API: the key (asked for once after a 401, kept in sessionStorage), and errors in words.

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
  const message = sentKey ? "That key was not accepted: try again." : "This server needs an API key.";
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
  return new ApiError(status, "http_error", statusText || `the server answered HTTP ${status}`);
}

const LEADS = {
  unauthorized: "The API key is missing or wrong",
  busy: "The server is busy",
  llm_unavailable: "The language model is not available",
  embedder_unavailable: "The embedding server is not available",
  store_unavailable: "The document store is not available",
  backend_unavailable: "A backend is not available",
  question_too_long: "The question is too long",
  exceed_context_size: "The prompt did not fit the model's context",
  too_large: "Too large",
  unsupported_file_type: "Unsupported file type",
  document_rejected: "Nothing to index",
  not_found: "Not found",
};

// One sentence for the user: a lead for the known codes, the API's own message, the status.
export function describeError(error) {
  if (error instanceof TypeError) return "Could not reach the API (network error).";
  if (!(error instanceof ApiError)) return String(error && error.message ? error.message : error);
  let lead = LEADS[error.code];
  if (lead && error.message.toLowerCase().startsWith(lead.toLowerCase())) lead = null; // said already
  const retry = error.code === "busy" && error.detail && error.detail.retry_after
    ? ` Try again in ${error.detail.retry_after} s.` : "";
  const status = error.status ? ` (HTTP ${error.status})` : "";
  return `${lead ? `${lead}: ` : ""}${error.message}${status}.${retry}`.replace(/\.\.(\s|$)/, ".$1");
}
