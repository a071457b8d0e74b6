"""What a page's CSS hides: the declarations that make text invisible, and the elements its `<style>`
rules hide.

tinycss2 parses (a CSS Syntax Level 3 tokenizer: linear in the input, comments, strings and at-rules
handled, nothing fetched). The page's own selectors are matched by the HTML parser's selector engine
(Lexbor), so `.box > p.note`, `#trap` or `[data-x]` hide exactly what a browser would; rules inside
`@media screen` / `@supports` / `@layer` count, `@media print` does not, and `@import` is a statement that
ends before the next rule; a nested rule (`.card { & span { ... } }`, `.card { em { ... } }`) counts
with its parent's selector. Only declarations that hide whatever else applies are read (no cascade):

- `display: none`, `visibility: hidden | collapse`, `content-visibility: hidden`;
- a font too small to read (under 3 px / 2.25 pt / 0.19 em / 20%, `font: 0/0 a`);
- `opacity` or `filter: opacity()` under 0.1, `filter: blur()` of 8 px and more; `color: transparent`
  or an alpha under 0.1;
- `transform: scale()` (or scaleX/scaleY/scale3d) with a factor under 0.05, `zoom` under 0.05;
- `transform: translate()` (or translateX/translateY/translate3d) by -999 px and beyond;
- a clip that leaves nothing: `clip: rect(0 0 0 0)`, `clip-path: inset(50%)` or more, `circle(0)`;
- an offset of -999 px and beyond (in any absolute or font unit): `left`, `top`, `right`, `text-indent`,
  the left and top margins;
- a zero `height`/`width`/`max-height`/`max-width` with `overflow: hidden`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import tinycss2
from tinycss2 import ast

_OFFSETS = {"left", "top", "right", "text-indent", "margin-left", "margin-top"}
_BOXES = {"height", "width", "max-height", "max-width"}
_PX = {
    "px": 1.0,
    "pt": 4 / 3,
    "pc": 16.0,
    "em": 16.0,
    "rem": 16.0,
    "ex": 8.0,
    "ch": 8.0,
    "mm": 3.78,
    "cm": 37.8,
    "in": 96.0,
    "q": 0.945,
}
_SCALES = {"scale", "scalex", "scaley", "scale3d"}
_TRANSLATES = {"translate", "translatex", "translatey", "translate3d"}
BLUR_PX = 8.0  # a blur this wide leaves text of 16 px a smear
_NESTED = {"media", "supports", "layer", "container", "document"}
MAX_RULES = 2_000  # a page's hiding rules matched against its DOM (each match walks the tree)


def hides(declarations: str) -> bool:
    """Whether an inline `style` attribute (a declaration list) hides its element."""
    return _hiding(
        _declarations(tinycss2.parse_blocks_contents(declarations, skip_comments=True, skip_whitespace=True))
    )


def text_color(declarations: str) -> tuple[str | None, str | None]:
    """(color, background) of a declaration list as serialized CSS values, lowercased (None: not set)."""
    values = _declarations(tinycss2.parse_blocks_contents(declarations, skip_comments=True, skip_whitespace=True))
    background = values.get("background-color") or values.get("background")
    return values.get("color"), background.split()[0] if background else None


def hiding_selectors(stylesheet: str) -> Iterator[str]:
    """The selectors of the rules in `stylesheet` whose declarations hide (see the module docstring)."""
    rules = tinycss2.parse_stylesheet(stylesheet, skip_comments=True, skip_whitespace=True)
    count = 0
    for selector, content in _qualified(rules):
        if _hiding(_declarations(tinycss2.parse_blocks_contents(content, skip_comments=True, skip_whitespace=True))):
            count += 1
            if count > MAX_RULES:
                return
            yield selector


def _qualified(rules: Iterable[Any]) -> Iterator[tuple[str, list[Any]]]:
    """(selector, content) of each style rule, descending into the at-rules that apply on a screen and
    into the rules nested in a rule (their selector resolved against their parent's)."""
    # Iterative: a stylesheet can nest blocks deeper than Python recurses. Each level: its rules, the parent selector.
    stack: list[tuple[Iterator[Any], str | None]] = [(iter(rules), None)]
    while stack:
        rule = next(stack[-1][0], None)
        parent = stack[-1][1]
        if rule is None:
            stack.pop()
        elif rule.type == "qualified-rule" and rule.content is not None:
            selector = _nested_selector(tinycss2.serialize(rule.prelude).strip(), parent)
            yield selector, rule.content
            nested = tinycss2.parse_blocks_contents(rule.content, skip_comments=True, skip_whitespace=True)
            stack.append((iter([n for n in nested if n.type == "qualified-rule"]), selector))
        elif (
            rule.type == "at-rule"
            and rule.lower_at_keyword in _NESTED
            and rule.content is not None
            and _on_screen(rule)
        ):
            stack.append(
                (iter(tinycss2.parse_rule_list(rule.content, skip_comments=True, skip_whitespace=True)), parent)
            )


def _nested_selector(selector: str, parent: str | None) -> str:
    """A nested rule's selector as a top-level one: `&` is its parent, and one without `&` a descendant."""
    if parent is None:
        return selector
    return ", ".join(
        part.replace("&", outer.strip()) if "&" in part else f"{outer.strip()} {part.strip()}"
        for outer in parent.split(",")
        for part in selector.split(",")
    )


def _on_screen(rule: Any) -> bool:
    """An at-rule whose block applies on a screen (`@media print` alone does not)."""
    prelude = tinycss2.serialize(rule.prelude).lower()
    return "print" not in prelude or "screen" in prelude


def _declarations(nodes: Iterable[Any]) -> dict[str, str]:
    """Property name -> value (serialized, lowercased, without `!important`); the last one wins."""
    values: dict[str, str] = {}
    for node in nodes:
        if node.type == "declaration":
            values[node.lower_name] = tinycss2.serialize(node.value).strip().lower()
    return values


def _hiding(values: dict[str, str]) -> bool:
    if not values:
        return False
    if values.get("display") == "none" or values.get("visibility") in ("hidden", "collapse"):
        return True
    if values.get("content-visibility") == "hidden":
        return True
    if "font-size" in values and _tiny_font(values["font-size"]):
        return True
    if "font" in values and _tiny_font(values["font"].split("/")[0].split()[-1] if values["font"] else ""):
        return True
    if _faint(values.get("opacity")) or _faint_filter(values.get("filter")) or _clear(values.get("color")):
        return True
    if _scaled_away(values.get("transform")) or _clipped(values.get("clip"), values.get("clip-path")):
        return True
    if _moved_away(values.get("transform")) or _faint(values.get("zoom"), 0.05):
        return True
    if any(_far_off(values[p]) for p in _OFFSETS & values.keys()):
        return True
    overflow = values.get("overflow", "") + " " + values.get("overflow-y", "") + values.get("overflow-x", "")
    return "hidden" in overflow and any(_length_px(values[p]) == 0 for p in _BOXES & values.keys())


def _tokens(value: str) -> list[Any]:
    return [t for t in tinycss2.parse_component_value_list(value, skip_comments=True) if t.type != "whitespace"]


def _length_px(value: str) -> float | None:
    """A single length in CSS pixels (0 without a unit is 0), or None when the value is not one."""
    tokens = _tokens(value)
    if len(tokens) != 1:
        return None
    token = tokens[0]
    if token.type == "number" and token.value == 0:
        return 0.0
    if token.type == "dimension" and token.lower_unit in _PX:
        return float(token.value * _PX[token.lower_unit])
    return None


def _tiny_font(value: str) -> bool:
    tokens = _tokens(value)
    if len(tokens) != 1:
        return False
    token = tokens[0]
    if token.type == "percentage":
        return bool(token.value < 20)
    size = _length_px(value)
    return size is not None and size < 3


def _number(token: Any) -> float | None:
    if token.type == "number":
        return float(token.value)
    if token.type == "percentage":
        return float(token.value) / 100
    return None


def _faint(value: str | None, under: float = 0.1) -> bool:
    tokens = _tokens(value) if value else []
    number = _number(tokens[0]) if len(tokens) == 1 else None
    return number is not None and number < under


def _faint_filter(value: str | None) -> bool:
    for token in _tokens(value) if value else []:
        if isinstance(token, ast.FunctionBlock) and token.lower_name == "opacity":
            args = [_number(a) for a in token.arguments if a.type not in ("whitespace", "literal")]
            if args and args[0] is not None and args[0] < 0.1:
                return True
        if isinstance(token, ast.FunctionBlock) and token.lower_name == "blur":
            radius = _length_px(tinycss2.serialize(token.arguments))
            if radius is not None and radius >= BLUR_PX:
                return True
    return False


def _clear(color: str | None) -> bool:
    """A text colour that shows nothing: transparent, or an alpha under 0.1."""
    if not color:
        return False
    if color == "transparent":
        return True
    for token in _tokens(color):
        if isinstance(token, ast.FunctionBlock) and token.lower_name in ("rgba", "rgb", "hsla", "hsl"):
            args = [a for a in token.arguments if a.type not in ("whitespace", "literal")]
            alpha = _number(args[3]) if len(args) == 4 else None
            return alpha is not None and alpha < 0.1
        if token.type == "hash" and len(token.value) in (4, 8):  # #rgba, #rrggbbaa
            alpha_hex = token.value[-1] * 2 if len(token.value) == 4 else token.value[-2:]
            try:
                return int(alpha_hex, 16) < 26
            except ValueError:
                return False
    return False


def _scaled_away(value: str | None) -> bool:
    for token in _tokens(value) if value else []:
        if isinstance(token, ast.FunctionBlock) and token.lower_name in _SCALES:
            factors = [_number(a) for a in token.arguments if a.type in ("number", "percentage")]
            if any(f is not None and abs(f) < 0.05 for f in factors):
                return True
    return False


def _moved_away(value: str | None) -> bool:
    for token in _tokens(value) if value else []:
        if isinstance(token, ast.FunctionBlock) and token.lower_name in _TRANSLATES:
            if any(a.type == "dimension" and _far_off(tinycss2.serialize([a])) for a in token.arguments):
                return True
    return False


def _clipped(clip: str | None, clip_path: str | None) -> bool:
    for value in (clip, clip_path):
        for token in _tokens(value) if value else []:
            if not isinstance(token, ast.FunctionBlock):
                continue
            sizes = [a for a in token.arguments if a.type in ("number", "dimension", "percentage")]
            if token.lower_name == "rect" and sizes and all(abs(a.value) <= 1 for a in sizes):
                return True
            if token.lower_name == "inset" and sizes and sizes[0].type == "percentage" and sizes[0].value >= 50:
                return True
            if token.lower_name == "circle" and sizes and sizes[0].value == 0:
                return True
    return False


def _far_off(value: str) -> bool:
    tokens = _tokens(value)
    if not tokens or tokens[0].type != "dimension":
        return False
    px = _length_px(tinycss2.serialize([tokens[0]]))
    return px is not None and px <= -999
