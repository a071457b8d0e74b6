// The page's start: backend health, the API key dialog, and the two halves (documents, chat).

import { apiKey, saveKey, setKeyPrompt } from "./api.js";
import { initChat } from "./chat.js";
import { initLibrary, library, refreshLibrary } from "./library.js";

const $ = (id) => document.getElementById(id);

const HEALTH_LOADING_MS = 2000;
const HEALTH_READY_MS = 15000;

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
  showHealth(state, body);
  setTimeout(pollHealth, state === "ok" ? HEALTH_READY_MS : HEALTH_LOADING_MS);
}

function showHealth(state, body) {
  const box = $("health");
  box.dataset.state = state;
  const backends = (body && body.backends) || {};
  const notOk = Object.entries(backends).filter(([, b]) => b.state !== "ok")
    .map(([name, b]) => `${name} ${b.state}${b.reason ? ` (${b.reason})` : ""}`);
  if (state === "ok") {
    const llm = backends.llm || {};
    const model = llm.model ? llm.model.split("/").pop() : ""; // a path when the server has no alias
    box.textContent = `Ready${model ? ` · ${model}` : ""}${llm.n_ctx ? ` · ${llm.n_ctx.toLocaleString("en-US")}-token context` : ""}`;
  } else if (state === "loading") {
    box.textContent = `The backends are loading (${notOk.join(", ")}); questions wait until they are ready.`;
  } else if (state === "down") {
    box.textContent = `A backend is down: ${notOk.join(", ")}.`;
  } else {
    box.textContent = "The API does not answer; retrying…";
  }
  // Only a loading model blocks asking: a down backend answers with an error that says why.
  $("send").disabled = state === "loading";
}

// The key dialog: opened after a 401 (or with the header button); resolves to the key or null.
function promptKey(reason) {
  const dialog = $("key-dialog");
  $("key-reason").textContent = reason || "Enter the API key of this server.";
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
    const key = await promptKey("The key is kept in this tab only (session storage).");
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
  $("empty-hint").textContent = empty
    ? `The collection “${library.collection}” is empty: upload documents first, or answers will have no sources.`
    : "";
}

initKeyDialog();
initLibrary(showCollectionHint);
initChat();
pollHealth();
refreshLibrary();
