"""HTML: the main text of a page, with its headings as structure.

selectolax's Lexbor backend parses (a C parser that follows the HTML5 spec, fast and tolerant of broken
markup). It has no way to fetch anything: it never sees a URL as more than a string, so `<img>`,
`<link>`, `<iframe>` and scripts cannot make us touch the network. Dropped: scripts, styles, templates,
noscript, embedded objects and form controls; hidden elements (`hidden`, `aria-hidden="true"`, inline
`display:none` / `visibility:hidden`); navigation and asides, and page headers and footers outside the
main content. When the page marks its main content (`<main>`, `role="main"`, a single `<article>`) only
that is kept.

Readability-style rules drop the rest of the boilerplate that pages do not mark with tags:
- block elements whose class or id names page furniture (readability's "unlikely candidates": header,
  footer, nav, menu, sidebar, breadcrumbs, pagination, toc, related...), unless they also name content;
- blocks of links, separators and navigation words ("Next: Simple Example, Up: Using libffi [Index]", a
  table of contents line): at least half their letters are link text, and outside the links fewer than
  three letters remain once Next/Previous/Up/Home/Index/Contents/Top and the like are taken out (so
  "See Types." and "message <string> | <Error>" stay);
- text hidden by CSS where the page says so itself, inline or in its `<style>` rules (`ingest.loaders.css`:
  no display, a font too small to read, near-zero opacity, a transparent colour, scaled to nothing,
  clipped away, far off-screen, a zero box with its overflow hidden), a colour equal to the background it
  sits on (white on white), and the classes that frameworks hide (`hidden`, `d-none`, `sr-only`...).
trafilatura was tried for this and not kept: in its precision mode it dropped function prototypes and
code examples (27% of Node.js's fs.html, 2.1 s for that page), and in its recall mode every navigation
line stayed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser, LexborNode, SelectolaxError

from ..detect import decode_text
from ..models import DocKind, LoadedDocument
from ._builder import DocumentBuilder, clean
from .css import hides, hiding_selectors, text_color
from .tables import MarkdownTable, markdown_table

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
_HIDDEN_CLASSES = {
    "hidden", "hide", "d-none", "invisible", "sr-only", "visually-hidden", "visuallyhidden", "screen-reader-text",
    "screenreader", "offscreen", "u-hidden", "is-hidden",
}  # fmt: skip
# readability.js's unlikely candidates (plus navigation names), and the names that keep an element anyway.
_FURNITURE = re.compile(
    r"-ad-|banner|breadcrumb|combx|comment|community|cookie|disqus|footer|gdpr|header|legends|menu|navbar"
    r"|navheader|navfooter|nav-panel|^nav$|related|remark|replies|rss|shoutbox|sidebar|skyscraper|social|sponsor"
    r"|supplemental|pagination|pager|popup|^toc$|toc-|skip-link|share",
    re.I,
)
_CONTENT_NAME = re.compile(r"article|body|column|content|main|shadow", re.I)
# Selectors that depend on state or generated content: the text is not hidden while a reader looks.
_DYNAMIC_SELECTOR = re.compile(r":(?!not\b|is\b|where\b|nth-|first-|last-|only-|root\b|empty\b)|::")
_NAMED = {"white": "#ffffff", "black": "#000000", "transparent": None}
_LETTER = re.compile(r"[^\W\d_]")
_NAV_WORDS = re.compile(r"\b(?:next|previous|prev|up|home|index|contents|top|back|forward|jump to|go to|toc)\b", re.I)
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
    rules = _PageRules.of(tree)
    _Walker(builder, rules).walk(_main_node(tree, rules))
    return builder.build(name, DocKind.HTML, title=title or None, encoding=encoding)


class _PageRules:
    """What this page hides: the framework classes, and the elements its own `<style>` rules hide."""

    def __init__(self, hidden_nodes: set[int]) -> None:
        self.hidden_nodes = hidden_nodes  # mem_id of each element a stylesheet rule hides

    @classmethod
    def of(cls, tree: LexborHTMLParser) -> _PageRules:
        hidden: set[int] = set()
        for style in tree.css("style"):
            for selector in hiding_selectors(style.text(deep=True)):
                if _DYNAMIC_SELECTOR.search(selector):
                    continue
                try:
                    hidden.update(node.mem_id for node in tree.css(selector))
                except (SelectolaxError, ValueError):  # a selector Lexbor does not know: a browser ignores it too
                    continue
        return cls(hidden)

    def hidden(self, node: LexborNode, background: str | None) -> bool:
        if node.mem_id in self.hidden_nodes:
            return True
        attrs = node.attributes
        if not attrs:
            return False
        if "hidden" in attrs or attrs.get("aria-hidden") == "true" or attrs.get("type") == "hidden":
            return True
        if (attrs.get("role") or "").lower() in _BOILERPLATE_ROLES:
            return True
        if any(n in _HIDDEN_CLASSES for n in (attrs.get("class") or "").lower().split()):
            return True
        style = attrs.get("style") or ""
        if style and hides(style):
            return True
        color = _color(attrs.get("color")) or _color(text_color(style)[0] if style else None)
        return color is not None and color == _background(node, background)

    @staticmethod
    def furniture(node: LexborNode) -> bool:
        """Page furniture by its class or id (a header, a navigation panel, a sidebar...)."""
        attrs = node.attributes
        names = [n for n in ((attrs.get("class") or "").split() + [attrs.get("id") or ""]) if n]
        return any(_FURNITURE.search(n) for n in names) and not any(_CONTENT_NAME.search(n) for n in names)


def _color(value: str | None) -> str | None:
    """A CSS colour as #rrggbb (named white/black, #rgb, rgb()), or None when not one of those."""
    if not value:
        return None
    value = value.strip().lower()
    if value in _NAMED:
        return _NAMED[value]
    if re.fullmatch(r"#[0-9a-f]{3}", value):
        return "#" + "".join(c * 2 for c in value[1:])
    if re.fullmatch(r"#[0-9a-f]{6}", value):
        return value
    if (rgb := re.fullmatch(r"rgba?\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*1(?:\.0*)?\s*)?\)", value)) is not None:
        return "#" + "".join(f"{min(int(c), 255):02x}" for c in rgb.groups())
    return None


def _background(node: LexborNode, inherited: str | None) -> str | None:
    """The background an element's text sits on: its own (style or bgcolor) or its parent's."""
    attrs = node.attributes
    style = attrs.get("style")
    background = text_color(style)[1] if style else None
    if background is not None:
        return _color(background) or inherited  # transparent or unknown: the parent's shows through
    return _color(attrs.get("bgcolor")) or inherited


def _main_node(tree: LexborHTMLParser, rules: _PageRules) -> LexborNode:
    for selector in ("main", "[role=main]"):
        node = tree.css_first(selector)
        if node is not None and not rules.hidden(node, None):
            return node
    articles = tree.css("article")
    if len(articles) == 1:
        return articles[0]
    return tree.body or tree.root  # type: ignore[return-value]


def _collapse(text: str) -> str:
    return "\n".join(_SPACE.sub(" ", clean(line)).strip() for line in text.split(_BREAK)).strip()


def _navigation(text: str, link_letters: int, plain: str) -> bool:
    """A block of links, separators and navigation words: at least half its letters are link text, and
    the text outside the links keeps fewer than 3 letters once the navigation words are taken out."""
    letters = len(_LETTER.findall(text))
    return letters > 0 and link_letters * 2 >= letters and len(_LETTER.findall(_NAV_WORDS.sub(" ", plain))) < 3


@dataclass
class _Frame:
    node: LexborNode
    in_content: bool
    in_link: bool
    background: str | None
    leaving: bool = False


class _Walker:
    """Walks the DOM iteratively (hostile pages nest deeper than Python's recursion limit)."""

    def __init__(self, builder: DocumentBuilder, rules: _PageRules) -> None:
        self.builder = builder
        self.rules = rules
        self.inline: list[str] = []
        self.link_letters = 0
        self.plain: list[str] = []  # the block's text outside links
        self.last_tight = False

    def walk(self, root: LexborNode) -> None:
        # Children are pushed in reverse; a frame is visited again when its element closes.
        stack = [_Frame(root, root.tag in _CONTENT, False, _background(root, "#ffffff"))]
        while stack:
            frame = stack.pop()
            node, tag = frame.node, frame.node.tag
            if frame.leaving:
                self._leave(tag)
                continue
            if node.is_text_node:
                text = node.text_content or ""
                self.inline.append(text)
                if frame.in_link:
                    self.link_letters += len(_LETTER.findall(text))
                else:
                    self.plain.append(text)
                continue
            if not node.is_element_node or tag in _SKIP or self.rules.hidden(node, frame.background):
                continue
            furniture = (
                tag in _BLOCKS and node is not root and self.rules.furniture(node)
            )  # not inline: <b class=header>
            if not frame.in_content and (tag in _CHROME or furniture):
                continue
            if self._enter(node, tag or ""):  # an element node has a tag
                frame.leaving = True
                stack.append(frame)
                children = []
                child = node.child
                while child is not None:
                    children.append(child)
                    child = child.next
                inside = frame.in_content or tag in _CONTENT
                in_link = frame.in_link or tag == "a"
                background = _background(node, frame.background)
                stack.extend(_Frame(c, inside, in_link, background) for c in reversed(children))

    def _enter(self, node: LexborNode, tag: str) -> bool:
        """Handles an opening tag; False when the element was consumed whole."""
        if (heading := _HEADING.fullmatch(tag)) is not None:
            self._flush()
            title = _collapse(node.text(deep=True))
            if title:
                self.builder.heading(title, int(heading.group(1)))
                self.last_tight = False
            return False
        if tag == "table" and (table := html_table(node, self.rules)) is not None:
            self._flush()
            self.builder.table(table.text, table.header)
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

    def _leave(self, tag: str | None) -> None:
        if tag in _BLOCKS and tag not in ("td", "th"):
            self._flush(tight=tag in _TIGHT)
            if tag not in _TIGHT:
                self.last_tight = False  # a list or table ended: what follows is a new paragraph

    def _flush(self, tight: bool = False) -> None:
        text = _collapse("".join(self.inline))
        navigation = _navigation(text, self.link_letters, "".join(self.plain))
        self.inline.clear()
        self.plain.clear()
        self.link_letters = 0
        if not navigation:
            self._emit(text, tight)

    def _emit(self, text: str, tight: bool) -> None:
        if text:
            self.builder.block(text, sep="\n" if tight and self.last_tight else "\n\n")
            self.last_tight = tight


# Tables.


def html_table(node: LexborNode, rules: _PageRules) -> MarkdownTable | None:
    """A data table as markdown (its `<caption>`, then its rows, the first as header); None for a layout
    table (nested tables, or fewer than two rows of two cells), which is walked as blocks instead."""
    if len(node.css("table")) > 1:  # the selector matches the node itself too
        return None
    rows = []
    for tr in node.css("tr"):
        if rules.hidden(tr, None):
            continue
        cells = [c for c in tr.iter() if c.tag in ("td", "th")]
        rows.append([_collapse(c.text(deep=True, separator=" ")) for c in cells if not rules.hidden(c, None)])
    if sum(1 for row in rows if len(row) >= 2) < 2:
        return None
    caption = node.css_first("caption")
    return markdown_table(
        rows, caption=_collapse(caption.text(deep=True, separator=" ")) if caption is not None else None
    )
