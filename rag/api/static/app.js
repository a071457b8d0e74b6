// The page's start: backend health, the API key dialog, and the two halves (documents, chat).

import { apiKey, saveKey, setKeyPrompt } from "./api.js";
import { initChat } from "./chat.js";
import { LANGUAGES, chooseLanguage, formatNumber, preferredLanguage, t, useLanguage } from "./i18n.js";
import { initLibrary, library, refreshLibrary } from "./library.js";

const $ = (id) => document.getElementById(id);

const HEALTH_LOADING_MS = 2000;
const HEALTH_READY_MS = 15000;

let lastHealth = ["unknown", null]; // shown again in a newly chosen language

async function pollHealth() {
  let state = "unreachable";
  let body = null;
  try {
    const response = await fetch("/health", { signal: AbortSignal.timeout(5000) });
    body = await response.json();
    state = body.status;
  } catch (_) {
    // the API itself is down or restarting: say so and keep polling
  }
  lastHealth = [state, body];
  showHealth(state, body);
  setTimeout(pollHealth, state === "ok" ? HEALTH_READY_MS : HEALTH_LOADING_MS);
}

function showHealth(state, body) {
  const box = $("health");
  box.dataset.state = state;
  const backends = (body && body.backends) || {};
  const notOk = Object.entries(backends).filter(([, b]) => b.state !== "ok")
    .map(([name, b]) => t(b.reason ? "health.backendReason" : "health.backend", { name, state: b.state, reason: b.reason }));
  const list = notOk.join(t("list.separator"));
  if (state === "ok") {
    const llm = backends.llm || {};
    const model = llm.model ? llm.model.split("/").pop() : ""; // a path when the server has no alias
    box.textContent = model && llm.n_ctx
      ? t("health.readyModel", { model, context: formatNumber(llm.n_ctx) })
      : t("health.ready");
  } else if (state === "loading") {
    box.textContent = t("health.loading", { backends: list });
  } else if (state === "down") {
    box.textContent = t("health.down", { backends: list });
  } else if (state === "unknown") {
    box.textContent = t("health.checking");
  } else {
    box.textContent = t("health.unreachable");
  }
  // Only a loading model blocks asking: a down backend answers with an error that says why.
  $("send").disabled = state === "loading";
}

// The key dialog: opened after a 401 (or with the header button); resolves to the key or null.
function promptKey(reason) {
  const dialog = $("key-dialog");
  $("key-reason").textContent = reason || t("key.enter");
  $("key-input").value = apiKey() || "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const key = dialog.returnValue === "save" ? $("key-input").value.trim() : "";
      resolve(key || null);
    }, { once: true });
    dialog.showModal();
    $("key-input").focus();
  });
}

function initKeyDialog() {
  setKeyPrompt(promptKey);
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    $("key-dialog").close("save");
  });
  $("key-cancel").addEventListener("click", () => $("key-dialog").close("cancel"));
  $("key-forget").addEventListener("click", () => {
    saveKey(null);
    $("key-dialog").close("cancel");
  });
  $("key-button").addEventListener("click", async () => {
    const key = await promptKey(t("key.kept"));
    if (key) {
      saveKey(key);
      refreshLibrary();
    }
  });
}

// The chat says when the chosen collection holds nothing to answer from.
function showCollectionHint() {
  const empty = library.indexed === 0;
  $("empty-hint").hidden = !empty;
  $("empty-hint").textContent = empty ? t("chat.emptyCollection", { collection: library.collection }) : "";
}

// The language switch: each language named in its own; a choice re-renders what the page shows now
// (answers already given stay in the language they were written in) and is kept for the next visit.
function initLanguageSwitch() {
  const select = $("language");
  for (const [code, name] of Object.entries(LANGUAGES)) select.add(new Option(name, code));
  select.value = document.documentElement.lang;
  select.addEventListener("change", async () => {
    await chooseLanguage(select.value);
    showHealth(...lastHealth);
    refreshLibrary();
  });
}

await useLanguage(preferredLanguage());
initLanguageSwitch();
initKeyDialog();
initLibrary(showCollectionHint);
initChat();
pollHealth();
refreshLibrary();
