// A small Markdown subset rendered straight to DOM nodes. Text only ever enters the DOM through
// createTextNode/textContent, so no markup written by the model or found in a document becomes HTML.
// Images are shown as their alt text and never fetched; links open only for http(s) and mailto.
//
// Blocks: paragraphs, # headings, - / * / + / 1. lists, > quotes, ``` code fences, --- rules.
// Inline: `code`, **bold**, *italic*, _italic_, [text](url), ![alt](src), and citations [S1] or [S1, S2],
// which the caller turns into nodes (a link to the source, or plain text when the citation is invalid).

import { t } from "./i18n.js";

const FENCE = /^\s*(```|~~~)/;
const HEADING = /^(#{1,6})\s+(.*?)\s*#*\s*$/;
const ITEM = /^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(?:\s*\1){2,}\s*$/;
const BLANK = /^\s*$/;

// A link target: no spaces, parentheses only in balanced pairs one deep, as in wiki URLs.
const TARGET = "(?:[^()\\s]|\\([^()\\s]*\\))+";

const INLINE = new RegExp([
  "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)",        // 1, 2: code span
  "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*",            // 3: bold
  "(?<![A-Za-z0-9_])__(?=\\S)([\\s\\S]*?\\S)__(?![A-Za-z0-9_])", // 4: bold, not inside words
  "\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*",          // 5: italic
  "(?<![A-Za-z0-9_])_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?![A-Za-z0-9_])", // 6: italic
  `!\\[([^\\]]*)\\]\\(\\s*${TARGET}(?:\\s+"[^"]*")?\\s*\\)`,    // 7: image, never loaded
  `\\[([^\\]]+)\\]\\(\\s*(${TARGET})(?:\\s+"[^"]*")?\\s*\\)`, // 8, 9: link
  "\\[(S\\d+(?:\\s*[,;]\\s*S\\d+)*)\\]",           // 10: citations
  "(\\n)",                                         // 11: line break inside a paragraph
].join("|"), "g");

const SAFE_URL = /^(https?:\/\/|mailto:)/i;

// Returns a DocumentFragment; cite(id) returns the node that stands for citation `id`.
export function renderMarkdown(text, cite) {
  const fragment = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (BLANK.test(line)) {
      i += 1;
    } else if (FENCE.test(line)) {
      i = codeBlock(lines, i, fragment);
    } else if (HEADING.test(line)) {
      const [, hashes, title] = HEADING.exec(line);
      // The page has its own h1 and h2: a heading in an answer starts at h3.
      const heading = el(`h${Math.min(6, hashes.length + 2)}`);
      renderInline(title, heading, cite);
      fragment.append(heading);
      i += 1;
    } else if (RULE.test(line)) {
      fragment.append(el("hr"));
      i += 1;
    } else if (ITEM.test(line)) {
      i = list(lines, i, fragment, cite);
    } else if (QUOTE.test(line)) {
      const quoted = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i += 1) quoted.push(QUOTE.exec(lines[i])[1]);
      const quote = el("blockquote");
      quote.append(renderMarkdown(quoted.join("\n"), cite));
      fragment.append(quote);
    } else {
      i = paragraph(lines, i, fragment, cite);
    }
  }
  return fragment;
}

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

function startsBlock(line) {
  return BLANK.test(line) || FENCE.test(line) || HEADING.test(line) || ITEM.test(line) || QUOTE.test(line)
    || RULE.test(line);
}

function codeBlock(lines, start, parent) {
  const fence = FENCE.exec(lines[start])[1];
  const body = [];
  let i = start + 1;
  for (; i < lines.length && !lines[i].trim().startsWith(fence); i += 1) body.push(lines[i]);
  const pre = el("pre");
  const code = el("code");
  code.textContent = body.join("\n");
  pre.append(code);
  parent.append(pre);
  return i + 1; // past the closing fence (or the end, while the answer is still streaming)
}

function list(lines, start, parent, cite) {
  const ordered = Boolean(ITEM.exec(lines[start])[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered) node.start = Number(ITEM.exec(lines[start])[2]);
  let i = start;
  let item = null;
  let itemText = [];
  const flush = () => {
    if (item) renderInline(itemText.join("\n"), item, cite);
  };
  for (; i < lines.length; i += 1) {
    const match = ITEM.exec(lines[i]);
    if (match && Boolean(match[2]) === ordered) {
      flush();
      item = el("li");
      node.append(item);
      itemText = [match[3]];
    } else if (!match && !startsBlock(lines[i]) && /^\s+/.test(lines[i])) {
      itemText.push(lines[i].trim()); // an indented continuation line
    } else {
      break;
    }
  }
  flush();
  parent.append(node);
  return i;
}

function paragraph(lines, start, parent, cite) {
  const body = [lines[start]];
  let i = start + 1;
  for (; i < lines.length && !startsBlock(lines[i]); i += 1) body.push(lines[i]);
  const p = el("p");
  renderInline(body.join("\n"), p, cite);
  parent.append(p);
  return i;
}

export function renderInline(text, parent, cite) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) parent.append(document.createTextNode(text.slice(last, match.index)));
    last = match.index + match[0].length;
    parent.append(inlineNode(match, cite));
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

function inlineNode(m, cite) {
  if (m[1] !== undefined) return textElement("code", m[2]);
  if (m[3] !== undefined || m[4] !== undefined) return nested("strong", m[3] ?? m[4], cite);
  if (m[5] !== undefined || m[6] !== undefined) return nested("em", m[5] ?? m[6], cite);
  if (m[7] !== undefined) {
    return textElement("span", m[7] ? t("markdown.image", { alt: m[7] }) : t("markdown.imageNoAlt"), "image-placeholder");
  }
  if (m[8] !== undefined) return link(m[8], m[9], cite);
  if (m[10] !== undefined) return citations(m[10], cite);
  return el("br");
}

function textElement(tag, text, className) {
  const node = el(tag, className);
  node.textContent = text;
  return node;
}

function nested(tag, text, cite) {
  const node = el(tag);
  renderInline(text, node, cite);
  return node;
}

function link(label, url, cite) {
  if (!SAFE_URL.test(url)) return nested("span", label, cite);
  const a = el("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  renderInline(label, a, cite);
  return a;
}

function citations(list, cite) {
  const group = el("span", "citations");
  group.append(document.createTextNode("["));
  list.split(/\s*[,;]\s*/).forEach((id, n) => {
    if (n > 0) group.append(document.createTextNode(", "));
    group.append(cite(id));
  });
  group.append(document.createTextNode("]"));
  return group;
}
