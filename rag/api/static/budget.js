// The prompt budget of one answer: a bar over the context window and, on demand, the per-chunk table.

import { formatNumber as fmt, known, t } from "./i18n.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// The parts of the context window, in prompt order; "other" is the chat template's own tokens.
function segments(b) {
  const chunkTotal = b.chunks.reduce((sum, c) => sum + c.tokens, 0);
  const other = Math.max(0, b.used - b.system - b.history - b.question - chunkTotal);
  const free = Math.max(0, b.n_ctx - b.used - b.reserve);
  return [
    { kind: "system", label: t("budget.system"), tokens: b.system },
    { kind: "history", label: t("budget.history"), tokens: b.history },
    ...b.chunks.map((c) => ({ kind: "chunk", label: c.cut ? t("budget.chunkCut", { id: c.id }) : c.id, tokens: c.tokens })),
    { kind: "question", label: t("budget.question"), tokens: b.question },
    { kind: "other", label: t("budget.template"), tokens: other },
    { kind: "free", label: t("budget.unused"), tokens: free },
    { kind: "reserve", label: t("budget.reserve"), tokens: b.reserve },
  ].filter((s) => s.tokens > 0);
}

export function renderBudget(b) {
  const box = el("div", "budget");
  if (!b.n_ctx || !b.limit) {
    // Nothing retrieved: the API answers without building a prompt.
    box.append(el("p", "budget-summary", t("budget.none")));
    return box;
  }
  const chunkTotal = b.chunks.reduce((sum, c) => sum + c.tokens, 0);
  const summary = {
    used: fmt(b.used), limit: fmt(b.limit), count: b.chunks.length, tokens: fmt(chunkTotal), dropped: b.dropped.length,
  };
  box.append(el("p", "budget-summary", t(b.dropped.length ? "budget.summaryDropped" : "budget.summary", summary)), bar(b));

  const more = el("details", "budget-details");
  more.append(el("summary", "", t("budget.details")));
  box.append(more);
  const facts = el("ul", "budget-facts");
  for (const [label, value] of [
    ["budget.context", b.n_ctx], ["budget.limit", b.limit], ["budget.used", b.used], ["budget.system", b.system],
    ["budget.history", b.history], ["budget.question", b.question], ["budget.chunks", chunkTotal],
    ["budget.reserve", b.reserve],
  ]) facts.append(el("li", "", t("budget.fact", { label: t(label), value: fmt(value) })));
  if (b.dropped_turns) facts.append(el("li", "", t("budget.droppedTurns", { count: b.dropped_turns })));
  if (b.kept_turns) {
    facts.append(el("li", "", b.latest_turn_reserved
      ? t("budget.keptTurnsReserved", { count: b.kept_turns, tokens: fmt(b.latest_turn_reserved) })
      : t("budget.keptTurns", { count: b.kept_turns })));
  }
  more.append(facts);

  if (b.chunks.length) more.append(chunkTable(b.chunks));
  if (b.dropped.length) {
    more.append(el("p", "budget-dropped-title", t("budget.droppedChunks")));
    const list = el("ul", "budget-dropped");
    for (const d of b.dropped) list.append(el("li", "", t("budget.dropped", { chunk: d.chunk_id, reason: known(`reason.${d.reason}`, d.reason) })));
    more.append(list);
  }
  return box;
}

function bar(b) {
  const node = el("div", "budget-bar");
  node.setAttribute("role", "img");
  const parts = segments(b);
  node.setAttribute("aria-label", parts.map((s) => t("budget.segment", { label: s.label, tokens: fmt(s.tokens) }))
    .join(t("list.comma")));
  for (const s of parts) {
    const part = el("span", `seg seg-${s.kind}`);
    // Widths through the CSSOM: the page's policy allows no inline style attributes.
    part.style.flexGrow = String(s.tokens);
    part.title = t("budget.segmentTitle", { label: s.label, tokens: fmt(s.tokens) });
    node.append(part);
  }
  return node;
}

function chunkTable(chunks) {
  const table = el("table", "budget-chunks");
  const head = el("tr");
  for (const title of ["budget.source", "budget.chunk", "budget.tokens"]) head.append(el("th", "", t(title)));
  head.append(el("th", "", ""));
  head.querySelectorAll("th").forEach((th) => th.setAttribute("scope", "col"));
  table.append(el("thead"));
  table.tHead.append(head);
  const body = el("tbody");
  for (const c of chunks) {
    const row = el("tr");
    row.append(el("td", "", c.id), el("td", "chunk-id", c.chunk_id), el("td", "num", fmt(c.tokens)),
      el("td", "", c.cut ? t("budget.cutToFit") : ""));
    body.append(row);
  }
  table.append(body);
  return table;
}
