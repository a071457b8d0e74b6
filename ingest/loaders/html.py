"""HTML: the main text of a page, with its headings as structure.

selectolax's Lexbor backend parses (a C parser that follows the HTML5 spec, fast and tolerant of broken
markup). It has no way to fetch anything: it never sees a URL as more than a string, so `<img>`,
`<link>`, `<iframe>` and scripts cannot make us touch the network. Dropped: scripts, styles, templates,
noscript, embedded objects and form controls; hidden elements (`hidden`, `aria-hidden="true"`, inline
`display:none` / `visibility:hidden`); navigation and asides, and page headers and footers outside the
main content. When the page marks its main content (`<main>`, `role="main"`, a single `<article>`) only
that is kept.
"""

from __future__ import annotations

import re

from selectolax.lexbor import LexborHTMLParser, LexborNode

from ..detect import decode_text
from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder, clean

_SKIP = {
    "script", "style", "template", "noscript", "head", "title", "meta", "link", "base",
    "svg", "math", "canvas", "iframe", "frame", "frameset", "object", "embed", "applet", "audio", "video",
    "picture", "source", "track", "map", "img", "button", "input", "select", "option", "textarea", "dialog",
    "nav", "aside", "menu",
}  # fmt: skip
_CHROME = {"header", "footer"}
_CONTENT = {"main", "article", "section"}
_BOILERPLATE_ROLES = {"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar", "dialog"}
_BLOCKS = {
    "address", "article", "blockquote", "body", "caption", "center", "dd", "details", "dir", "div", "dl", "dt",
    "fieldset", "figcaption", "figure", "footer", "form", "header", "hgroup", "hr", "html", "legend", "li",
    "main", "ol", "p", "section", "summary", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul",
}  # fmt: skip
_TIGHT = {"li", "tr", "dt", "dd"}  # consecutive ones are joined by one newline, not a blank line
_HEADING = re.compile(r"h([1-6])")
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)
_SPACE = re.compile(r"[ \t\n\r\f\v\u00a0\u200b]+")
_BREAK = "\x00"  # stands for <br> until whitespace is collapsed


def load_html(data: bytes, name: str, text: str | None = None, encoding: str | None = None) -> LoadedDocument:
    """The page's main text; `text` is the decoded page when the caller has it already."""
    if text is None:
        text, encoding = decode_text(data)
    tree = LexborHTMLParser(text)
    title_node = tree.css_first("title")
    title = _collapse(title_node.text()) if title_node is not None else None
    builder = DocumentBuilder()
    _Walker(builder).walk(_main_node(tree))
    return builder.build(name, DocKind.HTML, title=title or None, encoding=encoding)


def _main_node(tree: LexborHTMLParser) -> LexborNode:
    for selector in ("main", "[role=main]"):
        node = tree.css_first(selector)
        if node is not None and not _hidden(node):
            return node
    articles = tree.css("article")
    if len(articles) == 1:
        return articles[0]
    return tree.body or tree.root  # type: ignore[return-value]


def _hidden(node: LexborNode) -> bool:
    attrs = node.attributes
    if not attrs:
        return False
    if "hidden" in attrs or attrs.get("aria-hidden") == "true" or attrs.get("type") == "hidden":
        return True
    if (attrs.get("role") or "").lower() in _BOILERPLATE_ROLES:
        return True
    style = attrs.get("style")
    return bool(style and _HIDDEN_STYLE.search(style))


def _collapse(text: str) -> str:
    return "\n".join(line.strip() for line in _SPACE.sub(" ", text).split(_BREAK)).strip()


class _Walker:
    """Walks the DOM iteratively (hostile pages nest deeper than Python's recursion limit)."""

    def __init__(self, builder: DocumentBuilder) -> None:
        self.builder = builder
        self.inline: list[str] = []
        self.last_tight = False

    def walk(self, root: LexborNode) -> None:
        # Stack items: (node, inside main content, leaving). Children are pushed in reverse.
        stack: list[tuple[LexborNode, bool, bool]] = [(root, root.tag in _CONTENT, False)]
        while stack:
            node, in_content, leaving = stack.pop()
            tag = node.tag
            if leaving:
                self._leave(tag)
                continue
            if node.is_text_node:
                self.inline.append(node.text_content or "")
                continue
            if not node.is_element_node or tag in _SKIP or _hidden(node):
                continue
            if tag in _CHROME and not in_content:
                continue
            if self._enter(node, tag):
                stack.append((node, in_content, True))
                children = []
                child = node.child
                while child is not None:
                    children.append(child)
                    child = child.next
                inside = in_content or tag in _CONTENT
                stack.extend((c, inside, False) for c in reversed(children))

    def _enter(self, node: LexborNode, tag: str) -> bool:
        """Handles an opening tag; False when the element was consumed whole."""
        if (heading := _HEADING.fullmatch(tag)) is not None:
            self._flush()
            title = _collapse(node.text(deep=True))
            if title:
                self.builder.heading(title, int(heading.group(1)))
                self.last_tight = False
            return False
        if tag == "pre":
            self._flush()
            self._emit(clean(node.text(deep=True)).strip("\n"), tight=False)
            return False
        if tag == "br":
            self.inline.append(_BREAK)
        elif tag in ("td", "th"):
            if "".join(self.inline).strip():
                self.inline.append(" | ")
        elif tag in _BLOCKS:
            self._flush()
        return True

    def _leave(self, tag: str) -> None:
        if tag in _BLOCKS and tag not in ("td", "th"):
            self._flush(tight=tag in _TIGHT)
            if tag not in _TIGHT:
                self.last_tight = False  # a list or table ended: what follows is a new paragraph

    def _flush(self, tight: bool = False) -> None:
        text = _collapse("".join(self.inline))
        self.inline.clear()
        self._emit(text, tight)

    def _emit(self, text: str, tight: bool) -> None:
        if text:
            self.builder.block(text, sep="\n" if tight and self.last_tight else "\n\n")
            self.last_tight = tight
