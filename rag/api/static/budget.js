// The prompt budget of one answer: a bar over the context window and, on demand, the per-chunk table.

const fmt = (n) => Number(n || 0).toLocaleString("en-US");

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
    { kind: "system", label: "system prompt", tokens: b.system },
    { kind: "history", label: "earlier turns", tokens: b.history },
    ...b.chunks.map((c) => ({ kind: "chunk", label: `${c.id}${c.cut ? " (cut)" : ""}`, tokens: c.tokens })),
    { kind: "question", label: "question", tokens: b.question },
    { kind: "other", label: "template", tokens: other },
    { kind: "free", label: "unused", tokens: free },
    { kind: "reserve", label: "answer reserve", tokens: b.reserve },
  ].filter((s) => s.tokens > 0);
}

export function renderBudget(b) {
  const box = el("div", "budget");
  if (!b.n_ctx || !b.limit) {
    // Nothing retrieved: the API answers without building a prompt.
    box.append(el("p", "budget-summary", "Budget: no prompt was built (no sources to pack)."));
    return box;
  }
  const chunkTotal = b.chunks.reduce((sum, c) => sum + c.tokens, 0);
  const dropped = b.dropped.length ? ` · ${b.dropped.length} dropped` : "";
  box.append(el("p", "budget-summary", `Budget: ${fmt(b.used)} of ${fmt(b.limit)} prompt tokens · `
    + `${b.chunks.length} chunk${b.chunks.length === 1 ? "" : "s"} ${fmt(chunkTotal)}${dropped}`), bar(b));

  const more = el("details", "budget-details");
  more.append(el("summary", "", "Budget details"));
  box.append(more);
  const facts = el("ul", "budget-facts");
  for (const [label, value] of [
    ["context window", b.n_ctx], ["prompt limit", b.limit], ["used", b.used], ["system prompt", b.system],
    ["earlier turns", b.history], ["question", b.question], ["chunks", chunkTotal], ["answer reserve", b.reserve],
  ]) facts.append(el("li", "", `${label}: ${fmt(value)}`));
  if (b.dropped_turns) facts.append(el("li", "", `earlier turns left out: ${b.dropped_turns}`));
  if (b.kept_turns) facts.append(el("li", "", `turns kept: ${b.kept_turns}`
    + (b.latest_turn_reserved ? ` (the latest held first: ${fmt(b.latest_turn_reserved)} tokens)` : "")));
  more.append(facts);

  if (b.chunks.length) more.append(chunkTable(b.chunks));
  if (b.dropped.length) {
    more.append(el("p", "budget-dropped-title", "Dropped chunks"));
    const list = el("ul", "budget-dropped");
    for (const d of b.dropped) list.append(el("li", "", `${d.chunk_id}: ${d.reason}`));
    more.append(list);
  }
  return box;
}

function bar(b) {
  const node = el("div", "budget-bar");
  node.setAttribute("role", "img");
  const parts = segments(b);
  node.setAttribute("aria-label", parts.map((s) => `${s.label} ${fmt(s.tokens)}`).join(", "));
  for (const s of parts) {
    const part = el("span", `seg seg-${s.kind}`);
    // Widths through the CSSOM: the page's policy allows no inline style attributes.
    part.style.flexGrow = String(s.tokens);
    part.title = `${s.label}: ${fmt(s.tokens)} tokens`;
    node.append(part);
  }
  return node;
}

function chunkTable(chunks) {
  const table = el("table", "budget-chunks");
  const head = el("tr");
  for (const title of ["Source", "Chunk", "Tokens", ""]) head.append(el("th", "", title));
  head.querySelectorAll("th").forEach((th) => th.setAttribute("scope", "col"));
  table.append(el("thead"));
  table.tHead.append(head);
  const body = el("tbody");
  for (const c of chunks) {
    const row = el("tr");
    row.append(el("td", "", c.id), el("td", "chunk-id", c.chunk_id), el("td", "num", fmt(c.tokens)),
      el("td", "", c.cut ? "cut to fit" : ""));
    body.append(row);
  }
  table.append(body);
  return table;
}
