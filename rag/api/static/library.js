// The document side: the collection selector, uploads (one file per request, with progress) and the list.

import { apiFetch, apiJson, apiKey, authHeaders, describeError, errorFromBody, keyAfter401 } from "./api.js";
import { formatNumber, known, t } from "./i18n.js";

const PAGE = 50;
const COLLECTION_STORAGE = "rag.collection";
const FINISHED = [".upload[data-status=indexed]", ".upload[data-status=unchanged]", ".upload[data-status=failed]",
  ".upload[data-status=cancelled]"].join(", ");
const COLLECTION_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]$/;

const $ = (id) => document.getElementById(id);

export const library = {
  collection: localStorage.getItem(COLLECTION_STORAGE) || "default",
  indexed: null, // indexed documents of the collection, from /v1/collections
  onChange: () => {},
};

export function initLibrary(onChange) {
  library.onChange = onChange;
  $("collection").addEventListener("change", (event) => selectCollection(event.target.value));
  $("new-collection-form").addEventListener("submit", addCollection);
  $("choose-files").addEventListener("click", () => $("file-input").click());
  $("file-input").addEventListener("change", (event) => {
    uploadAll([...event.target.files]);
    event.target.value = "";
  });
  const zone = $("dropzone");
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("dragging");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("dragging"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("dragging");
    uploadAll([...event.dataTransfer.files]);
  });
  $("more-documents").addEventListener("click", () => loadDocuments(true));
  $("documents").addEventListener("click", deleteClicked);
  $("failures").addEventListener("click", deleteClicked);
  $("clear-uploads").addEventListener("click", () => {
    $("uploads").querySelectorAll(FINISHED).forEach((row) => row.remove());
    $("clear-uploads").hidden = true;
  });
}

export async function refreshLibrary() {
  await loadCollections(); // first: a scoped key may move the page to one of its own collections
  await loadDocuments();
  library.onChange();
}

function selectCollection(name) {
  library.collection = name;
  localStorage.setItem(COLLECTION_STORAGE, name);
  refreshLibrary();
}

function addCollection(event) {
  event.preventDefault();
  const input = $("new-collection");
  const name = input.value.trim();
  if (!COLLECTION_NAME.test(name)) {
    showLibraryError(t("library.badName"));
    return;
  }
  input.value = "";
  addOption(name, null);
  $("collection").value = name;
  selectCollection(name);
}

function addOption(name, documents) {
  const select = $("collection");
  let option = [...select.options].find((o) => o.value === name);
  if (!option) {
    option = new Option(name, name);
    select.add(option);
  }
  // A document is one indexed content, however many names it has; failed files are not documents.
  option.textContent = documents === null ? name : t("library.collectionOption", { name, count: documents });
}

// What the key opens (from /v1/collections): a scoped key's collections and whether it may write.
function applyKey(key) {
  const scoped = Boolean(key && key.collections);
  if (scoped && !key.collections.includes(library.collection)) {
    library.collection = key.collections[0];
    localStorage.setItem(COLLECTION_STORAGE, library.collection);
  }
  $("new-collection-form").hidden = scoped; // a scoped key opens its own collections only
  document.body.classList.toggle("read-only", Boolean(key && key.read_only));
  return scoped ? key.collections : [];
}

async function loadCollections() {
  try {
    const { collections, key } = await apiJson("/v1/collections");
    const own = applyKey(key);
    $("collection").replaceChildren();
    for (const c of collections) addOption(c.name, c.documents);
    for (const name of own) if (!collections.some((c) => c.name === name)) addOption(name, null);
    addOption(library.collection, null); // a new, still empty collection stays selectable
    const known = collections.find((c) => c.name === library.collection);
    if (known) addOption(known.name, known.documents);
    library.indexed = known ? known.documents : 0;
    $("collection").value = library.collection;
  } catch (error) {
    addOption(library.collection, null);
    showLibraryError(t("library.collectionsFailed", { error: describeError(error) }));
  }
}

let shown = 0;

async function loadDocuments(more = false) {
  const list = $("documents");
  const collection = library.collection;
  const offset = more ? shown : 0;
  const query = new URLSearchParams({ collection, offset, limit: PAGE });
  let page;
  try {
    page = await apiJson(`/v1/documents?${query}`);
  } catch (error) {
    if (error.status === 404 && error.code === "not_found") {
      // A collection the user has just named exists from its first upload on: until then it is empty.
      page = { documents: [], total: 0, failed: 0 };
    } else {
      showLibraryError(t("library.documentsFailed", { error: describeError(error) }));
      return;
    }
  }
  if (collection !== library.collection) return; // the user switched meanwhile
  if (!more) list.replaceChildren();
  for (const doc of page.documents) list.append(documentItem(doc));
  shown = offset + page.documents.length;
  $("documents-count").textContent = t("library.count", { count: page.total, collection });
  if (!more) await loadFailures(collection, page.failed);
  $("documents-empty").hidden = page.total > 0;
  $("documents-empty").textContent = t("library.empty", { collection });
  $("more-documents").hidden = shown >= page.total;
  showLibraryError("");
}

// Failed files, apart from the documents: each with its reason, and a delete button to clear it.
async function loadFailures(collection, count) {
  const list = $("failures");
  list.replaceChildren();
  $("failures-count").hidden = count === 0;
  if (count === 0) return;
  $("failures-count").textContent = t("library.failuresCount", { count, collection });
  const query = new URLSearchParams({ collection, state: "failed", limit: PAGE });
  try {
    const page = await apiJson(`/v1/documents?${query}`);
    if (collection === library.collection) for (const doc of page.documents) list.append(documentItem(doc));
  } catch (error) {
    showLibraryError(t("library.failuresFailed", { error: describeError(error) }));
  }
}

function documentItem(doc) {
  const item = document.createElement("li");
  item.className = "document";
  item.dataset.id = doc.id;
  item.dataset.state = doc.state;
  const name = document.createElement("span");
  name.className = "document-name";
  name.textContent = doc.source;
  name.title = doc.source;
  const meta = document.createElement("span");
  meta.className = "document-meta";
  const parts = [t("library.chunks", { count: doc.chunks })];
  if (doc.pages) parts.push(t("library.pages", { count: doc.pages }));
  if (doc.size != null) parts.push(formatBytes(doc.size));
  if (doc.state !== "indexed") {
    const state = known(`state.${doc.state}`, doc.state);
    parts.push(doc.error ? t("library.stateError", { state, error: doc.error }) : state);
  }
  meta.textContent = parts.join(t("list.separator"));
  const remove = document.createElement("button");
  remove.type = "button";
  remove.className = "delete";
  remove.textContent = t("library.delete");
  remove.setAttribute("aria-label", t("library.deleteLabel", { name: doc.source }));
  // The same content under other names is one document: its names are shown beneath it.
  const others = (doc.names || []).slice(1).map((n) => n.source);
  const also = document.createElement("span");
  also.className = "document-names";
  also.textContent = others.length ? t("library.alsoNamed", { names: others.join(t("list.comma")) }) : "";
  item.append(name, meta, ...(others.length ? [also] : []), remove);
  return item;
}

// Two presses delete: the first asks, the second (within a few seconds) does it.
async function deleteClicked(event) {
  const button = event.target.closest("button.delete");
  if (!button) return;
  const item = button.closest("li");
  const name = item.querySelector(".document-name").textContent;
  if (!button.dataset.armed) {
    button.dataset.armed = "1";
    button.textContent = t("library.confirmDelete");
    button.setAttribute("aria-label", t("library.confirmDeleteLabel", { name }));
    setTimeout(() => {
      if (!button.isConnected) return;
      delete button.dataset.armed;
      button.textContent = t("library.delete");
      button.setAttribute("aria-label", t("library.deleteLabel", { name }));
    }, 5000);
    return;
  }
  button.disabled = true;
  const query = new URLSearchParams({ collection: library.collection });
  try {
    await apiJson(`/v1/documents/${encodeURIComponent(item.dataset.id)}?${query}`, { method: "DELETE" });
    announce(t("library.deleted", { name }));
  } catch (error) {
    showLibraryError(t("library.deleteFailed", { name, error: describeError(error) }));
  }
  await refreshLibrary();
}

let queue = Promise.resolve();

function uploadAll(files) {
  const collection = library.collection;
  for (const file of files) {
    const row = uploadRow(file);
    // One at a time: the server indexes on a few cores, and each file keeps its own progress.
    queue = queue.then(() => uploadOne(file, collection, row)).then(refreshLibrary);
  }
}

function uploadRow(file) {
  const item = document.createElement("li");
  item.className = "upload";
  item.dataset.status = "queued";
  const name = document.createElement("span");
  name.className = "upload-name";
  name.textContent = t("upload.file", { name: file.name, size: formatBytes(file.size) });
  const progress = document.createElement("progress");
  progress.max = 100;
  progress.value = 0;
  progress.setAttribute("aria-label", t("upload.progressLabel", { name: file.name }));
  const status = document.createElement("span");
  status.className = "upload-status";
  status.textContent = t("upload.waiting");
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "upload-cancel";
  cancel.textContent = t("upload.cancel");
  cancel.setAttribute("aria-label", t("upload.cancelLabel", { name: file.name }));
  item.append(name, progress, status, cancel);
  $("uploads").append(item);
  // The job's own id, so that a cancel reaches the server while it indexes the file.
  const row = { item, progress, status, cancel, jobId: jobId(), cancelled: false, xhr: null };
  cancel.addEventListener("click", () => cancelUpload(row));
  return row;
}

function jobId() {
  return `page-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 12)}`;
}

// Waiting: it never starts. Sending: the request is aborted. Indexing: the server stops the job (the file
// being read is rolled back); the upload's own answer then ends the row.
async function cancelUpload(row) {
  if (row.cancelled) return;
  row.cancelled = true;
  row.cancel.disabled = true;
  if (row.item.dataset.status === "indexing") {
    row.status.textContent = t("upload.cancelling");
    try {
      await apiFetch(`/v1/jobs/${row.jobId}`, { method: "DELETE" });
    } catch {
      // Ended meanwhile (409) or the server is away: the upload's own answer says which.
    }
  } else if (row.xhr) {
    row.xhr.abort();
  }
}

async function uploadOne(file, collection, row) {
  for (;;) {
    if (row.cancelled) return finish(row, file, "cancelled", t("upload.cancelled"));
    const sentKey = apiKey();
    const { status, body } = await send(file, collection, row);
    // Aborted while sending (0), or stopped while indexing (409); one that ended first keeps its result.
    if (row.cancelled && (status === 0 || status === 409)) return finish(row, file, "cancelled", t("upload.cancelled"));
    if (status === 401) {
      const error = errorFromBody(status, body);
      if (await keyAfter401(sentKey)) continue;
      return finish(row, file, "failed", describeError(error));
    }
    if (status === 0) return finish(row, file, "failed", t("error.network"));
    if (status !== 200) return finish(row, file, "failed", describeError(errorFromBody(status, body)));
    const result = JSON.parse(body).results[0];
    if (result.status === "failed") return finish(row, file, "failed", result.reason || t("state.failed"));
    const text = t(result.status === "indexed" ? "upload.indexed" : "upload.unchanged", { count: result.chunks });
    return finish(row, file, result.status, text);
  }
}

// XMLHttpRequest, because fetch() reports no upload progress.
function send(file, collection, row) {
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    row.xhr = xhr;
    xhr.open("POST", `/v1/documents?job_id=${encodeURIComponent(row.jobId)}`);
    for (const [name, value] of Object.entries(authHeaders())) xhr.setRequestHeader(name, value);
    xhr.upload.addEventListener("progress", (event) => {
      if (!event.lengthComputable) return;
      row.progress.value = Math.round((100 * event.loaded) / event.total);
      row.status.textContent = t("upload.percent", { percent: row.progress.value });
    });
    xhr.upload.addEventListener("load", () => {
      row.progress.removeAttribute("value"); // indeterminate while the server indexes
      row.item.dataset.status = "indexing";
      row.status.textContent = t("upload.indexing");
    });
    xhr.addEventListener("loadend", () => resolve({ status: xhr.status, body: xhr.responseText }));
    const form = new FormData();
    form.append("files", file, file.name);
    form.append("collection", collection);
    row.item.dataset.status = "uploading";
    row.status.textContent = t("upload.uploading");
    xhr.send(form);
  });
}

function finish(row, file, status, text) {
  row.item.dataset.status = status;
  row.cancel.hidden = true;
  row.progress.value = status === "failed" || status === "cancelled" ? 0 : 100;
  row.status.textContent = status === "failed" ? t("upload.failed", { reason: text }) : text;
  $("clear-uploads").hidden = false;
  announce(t("upload.announce", { name: file.name, status: row.status.textContent }));
}

function showLibraryError(text) {
  $("library-error").textContent = text;
  $("library-error").hidden = !text;
}

export function announce(text) {
  $("announcer").textContent = text;
}

export function formatBytes(bytes) {
  if (bytes < 1024) return t("bytes.b", { n: formatNumber(bytes) });
  if (bytes < 1024 * 1024) return t("bytes.kib", { n: (bytes / 1024).toFixed(1) });
  return t("bytes.mib", { n: (bytes / 1024 / 1024).toFixed(1) });
}
