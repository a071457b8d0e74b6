// The conversation: kept in the page, sent whole as `messages`; answers stream from POST /v1/chat.

import { ApiError, apiFetch, describeError, errorFrom } from "./api.js";
import { renderBudget } from "./budget.js";
import { t } from "./i18n.js";
import { announce, library } from "./library.js";
import { renderMarkdown } from "./markdown.js";
import { readEvents } from "./sse.js";
import { clearPlace, showInPlace } from "./viewer.js";

const $ = (id) => document.getElementById(id);

const history = []; // [{role, content}], what the next question is sent with
let current = null; // the answer being streamed: {controller, view, ...}
let answers = 0; // numbers the answers, for ids of their source entries

export function initChat() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    ask();
  });
  $("question").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ask();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newConversation);
  $("messages").addEventListener("click", citationClicked);
  $("close-source").addEventListener("click", closeSource);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && !$("source-panel").hidden) closeSource();
  });
  openLinkedSource();
}

// A citation link from another client (`/?doc=...&chunk=...`: OpenAI-style `url_citation` annotations)
// opens that chunk in the source panel as a citation of this page would.
function openLinkedSource() {
  const params = new URLSearchParams(window.location.search);
  const doc = params.get("doc");
  const chunk = params.get("chunk");
  if (!doc || !chunk || !/^\d+$/.test(chunk)) return;
  openSource({
    id: params.get("cite") || "",
    doc_id: doc,
    chunk_id: `${doc}:${chunk}`,
    source: params.get("source") || doc,
    collection: params.get("collection") || undefined,
    text: "",
  }, null);
}

export function streaming() {
  return current !== null;
}

function newConversation() {
  if (current) stop();
  history.length = 0;
  $("messages").replaceChildren();
  closeSource();
  $("question").focus();
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function messageView(role) {
  const item = el("li", `message ${role}`);
  item.append(el("p", "role", t(role === "user" ? "chat.you" : "chat.assistant")));
  const body = el("div", role === "user" ? "question-text" : "answer markdown");
  item.append(body);
  $("messages").append(item);
  return { item, body };
}

function options() {
  const body = {};
  const topK = Number($("top-k").value);
  const maxTokens = Number($("max-tokens").value);
  if (topK > 0) body.top_k = topK;
  if (maxTokens > 0) body.max_tokens = maxTokens;
  return body;
}

async function ask() {
  const input = $("question");
  const question = input.value.trim();
  if (!question || current || $("send").disabled) return;
  input.value = "";
  history.push({ role: "user", content: question });
  const user = messageView("user");
  user.body.textContent = question;

  const view = messageView("assistant");
  answers += 1;
  view.item.id = `answer-${answers}`;
  view.status = el("p", "status", t("chat.searching"));
  view.status.setAttribute("role", "status");
  view.item.append(view.status);
  view.item.scrollIntoView({ block: "nearest" });
  const answer = {
    controller: new AbortController(), view, user, text: "", sources: new Map(), citations: null,
    state: "streaming", frame: 0, collection: library.collection,
  };
  current = answer;
  sourceMaps.set(view.item, answer.sources);
  setState(answer, "streaming");
  setBusy(true);
  const request = { messages: history.slice(), collection: library.collection, stream: true, ...options() };
  try {
    const response = await apiFetch("/v1/chat", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify(request),
      signal: answer.controller.signal,
    });
    if (!response.ok) throw await errorFrom(response);
    for await (const event of readEvents(response.body)) {
      handle(answer, event.event, JSON.parse(event.data));
      if (answer.state !== "streaming") break;
    }
    if (answer.state === "streaming") fail(answer, t("chat.streamEnded"));
  } catch (error) {
    if (answer.state === "streaming") {
      if (error.name === "AbortError") setState(answer, "stopped");
      else fail(answer, describeError(error));
    }
  } finally {
    finishTurn(answer);
  }
}

function stop() {
  if (!current) return;
  const answer = current;
  setState(answer, "stopped");
  answer.controller.abort(); // closes the connection; the API then closes llama-server's generation
}

function handle(answer, type, data) {
  if (type === "sources") showSources(answer, data.sources, data);
  else if (type === "budget") replaceBox(answer, ".budget", renderBudget(data));
  else if (type === "token") addText(answer, data.text);
  else if (type === "citations") {
    const model = data.citations.filter((c) => (c.kind || "model") === "model");
    answer.citations = { valid: new Set(model.map((c) => c.id)), invalid: new Set(data.invalid) };
    render(answer);
    replaceBox(answer, ".grounding", renderGrounding(answer, data));
  } else if (type === "done") {
    answer.done = data;
    setState(answer, "done");
  } else if (type === "error") {
    fail(answer, t("chat.answerFailed", { error: describeError(new ApiError(null, data.code, data.message)) }));
  }
}

function addText(answer, text) {
  answer.text += text;
  const writing = t("chat.writing");
  if (answer.view.status.textContent !== writing) answer.view.status.textContent = writing;
  // One render per frame, however fast tokens come.
  if (!answer.frame) {
    answer.frame = requestAnimationFrame(() => {
      answer.frame = 0;
      render(answer);
    });
  }
}

function render(answer) {
  const list = $("messages");
  const following = list.scrollHeight - list.scrollTop - list.clientHeight < 48;
  answer.view.body.replaceChildren(renderMarkdown(answer.text, (id) => citationNode(answer, id)));
  if (answer.done && answer.done.finish_reason === "length") {
    // A cut answer ends in a visible ellipsis, its reason on hover (and in the status line below).
    const cut = el("span", "cut-mark", " …");
    cut.title = t("done.length");
    answer.view.body.append(cut);
  }
  if (following) list.scrollTop = list.scrollHeight; // keep up with the answer unless the reader scrolled away
}

// A citation is a link only when the API vouches for it: listed in `citations` (once that event came),
// or, while the answer is still streaming, present among the sources.
function citationNode(answer, id) {
  const source = answer.sources.get(id);
  const valid = answer.citations
    ? answer.citations.valid.has(id) && !answer.citations.invalid.has(id) && source
    : source;
  if (!valid) {
    const text = el("span", "cite-invalid", id);
    text.title = t("chat.citationInvalid");
    return text;
  }
  const link = el("a", "cite", id);
  link.href = `#${answer.view.item.id}-${id}`;
  link.dataset.source = id;
  link.setAttribute("aria-label", t("chat.citationLabel", { id, source: sourceLabel(source) }));
  return link;
}


// A re-packed prompt (after llama-server refused the first) sends sources and budget again: the
// later pair replaces the earlier one.
function replaceBox(answer, selector, box) {
  const old = answer.view.item.querySelector(`:scope > ${selector}`);
  if (old) old.replaceWith(box);
  else answer.view.item.insertBefore(box, answer.view.status);
}

function showSources(answer, sources, event = {}) {
  answer.sources.clear();
  for (const s of sources) answer.sources.set(s.id, { ...s, collection: answer.collection });
  const box = el("details", "sources");
  const summary = el("summary", "", sources.length
    ? t("chat.sources", { count: sources.length })
    : t("chat.noSources"));
  if (event.query) summary.append(searchedLine(event));
  box.append(summary);
  const list = el("ol", "source-list");
  for (const s of sources) {
    const item = el("li");
    item.id = `${answer.view.item.id}-${s.id}`;
    const link = el("a", "source-link", t("chat.sourceEntry", { id: s.id, source: sourceLabel(s) }));
    link.href = `#${item.id}`;
    link.dataset.source = s.id;
    item.append(link, el("span", "snippet", s.snippet || ""));
    list.append(item);
  }
  box.append(list);
  replaceBox(answer, "details.sources", box);
  answer.view.status.textContent = t("chat.waiting");
}

// Both kinds of citation: the [Sn] the model wrote, and the sources found for each answer sentence
// after generation (with their support); a sentence that no source supports is flagged.
function renderGrounding(answer, data) {
  const box = el("div", "grounding");
  const byKind = (kind) => data.citations.filter((c) => (c.kind || "model") === kind);
  const line = (label, entries, cls) => {
    if (!entries.length) return;
    const row = el("p", cls, `${t(label)} `);
    entries.forEach((c, i) => {
      const link = el("a", "source-link", t("chat.sourceEntry", { id: c.id, source: sourceLabel(c) }));
      link.href = `#${answer.view.item.id}-${c.id}`;
      link.dataset.source = c.id;
      const percent = typeof c.support === "number" ? Math.round(c.support * 100) : null;
      if (percent !== null) link.title = t("chat.supportTitle", { percent });
      row.append(...(i ? [t("list.comma"), link] : [link]));
      if (percent !== null) row.append(el("span", "support", t("chat.support", { percent })));
    });
    box.append(row);
  };
  line("chat.supportedBy", byKind("attributed"), "attributed");
  line("chat.citedByModel", byKind("model"), "model-cited");
  for (const sentence of data.sentences || []) {
    if (!sentence.supported) box.append(el("p", "unsupported", t("chat.unsupported", { text: sentence.text })));
  }
  return box;
}

// The query retrieval actually ran: a follow-up's rewrite is shown, so a wrong one is visible.
function searchedLine(event) {
  const line = el("span", "searched");
  line.append(el("span", "searched-label", t(event.rewrite && event.rewrite !== "off"
    ? "chat.searchedRewritten" : "chat.searched")));
  line.append(el("q", "searched-query", event.query));
  return line;
}

function sourceLabel(s) {
  return s.page ? t("chat.sourcePage", { source: s.source, page: s.page }) : s.source;
}

function fail(answer, message) {
  answer.error = message;
  setState(answer, "error");
}

function setState(answer, state) {
  answer.state = state;
  answer.view.item.dataset.state = state;
  answer.view.item.setAttribute("aria-busy", String(state === "streaming"));
}

// While an answer streams, Stop takes Send's place.
function setBusy(busy) {
  $("stop").disabled = !busy;
  $("stop").hidden = !busy;
  $("send").hidden = busy;
}

function finishTurn(answer) {
  if (answer.frame) cancelAnimationFrame(answer.frame);
  answer.frame = 0;
  render(answer);
  const status = answer.view.status;
  if (answer.state === "done") {
    status.textContent = doneText(answer);
    status.className = "status meta";
  } else if (answer.state === "stopped") {
    status.textContent = t("chat.stopped");
  } else {
    status.textContent = answer.error;
    status.className = "status error";
  }
  if (answer.text) {
    history.push({ role: "assistant", content: answer.text });
  } else {
    // Nothing came back: the question leaves the conversation, so turns keep alternating.
    history.pop();
    answer.user.item.classList.add("unanswered");
  }
  announce(answer.state === "done" ? t("chat.complete") : status.textContent);
  current = null;
  answer.view.item.setAttribute("aria-busy", "false");
  const focusStop = document.activeElement === $("stop");
  setBusy(false);
  if (focusStop) $("question").focus();
}

function doneText(answer) {
  const d = answer.done || {};
  const parts = [];
  if (d.finish_reason === "no_sources") parts.push(t("done.noSources"));
  if (d.finish_reason === "length") parts.push(t("done.length"));
  if (d.unsure) parts.push(t("done.unsure"));
  if (d.usage && d.usage.completion_tokens) parts.push(t("done.tokens", { count: d.usage.completion_tokens }));
  if (d.ttft_ms != null) parts.push(t("done.ttft", { ms: Math.round(d.ttft_ms) }));
  if (d.timings && d.timings.predicted_per_second) parts.push(t("done.rate", { rate: d.timings.predicted_per_second.toFixed(1) }));
  if (d.invalid_citations) parts.push(t("done.invalid", { count: d.invalid_citations }));
  return parts.length ? parts.join(t("list.separator")) : t("done.done");
}

let opener = null;

// Each answer keeps its own sources: S1 of one answer is not S1 of the next.
const sourceMaps = new WeakMap();

function citationClicked(event) {
  const link = event.target.closest("a.cite, a.source-link");
  if (!link) return;
  event.preventDefault();
  const sources = sourceMaps.get(link.closest("li.message"));
  const source = sources && sources.get(link.dataset.source);
  if (source) openSource(source, link);
}

function openSource(source, link) {
  opener = link;
  $("source-title").textContent = t("source.heading", { id: source.id, source: source.source });
  const meta = $("source-meta");
  meta.replaceChildren();
  for (const [term, value] of [
    ["source.document", source.source], ["source.page", source.page], ["source.section", source.heading],
    ["source.score", typeof source.score === "number" ? source.score.toFixed(3) : source.score],
    ["source.chunk", source.chunk_id],
  ]) {
    if (value === undefined || value === null || value === "") continue;
    meta.append(el("dt", "", t(term)), el("dd", "", String(value)));
  }
  $("source-text").textContent = source.text;
  $("source-panel").hidden = false;
  document.body.classList.add("panel-open");
  $("source-panel").focus();
  showInPlace(source);
}

function closeSource() {
  if ($("source-panel").hidden) return;
  $("source-panel").hidden = true;
  clearPlace();
  document.body.classList.remove("panel-open");
  if (opener && opener.isConnected) opener.focus();
  opener = null;
}
