"""Ways a page hides text from its readers with CSS, each as a page fragment holding the word HIDDEN<n>,
beside look-alikes that a reader does see (each holding SHOWN<n>)."""

from __future__ import annotations

# (technique, a <style> sheet or "", the body fragment)
HIDING: list[tuple[str, str, str]] = [
    ("display:none inline", "", '<p style="display:none">{}</p>'),
    ("visibility:hidden", "", '<p style="visibility: hidden">{}</p>'),
    ("visibility:collapse", "", '<p style="visibility:collapse">{}</p>'),
    ("font-size:0", "", '<p style="font-size:0">{}</p>'),
    ("font-size:1px", "", '<p style="font-size:1px">{}</p>'),
    ("font-size:0.1em", "", '<p style="font-size:0.1em">{}</p>'),
    ("font shorthand 0/0", "", '<p style="font:0/0 a">{}</p>'),
    ("opacity:0", "", '<p style="opacity:0">{}</p>'),
    ("opacity:0.01", "", '<p style="opacity:0.01">{}</p>'),
    ("filter:opacity(0)", "", '<p style="filter: opacity(0%)">{}</p>'),
    ("color:transparent", "", '<p style="color:transparent">{}</p>'),
    ("color rgba alpha 0", "", '<p style="color: rgba(0, 0, 0, 0)">{}</p>'),
    ("white on white", "", '<div style="background:#fff"><span style="color:white">{}</span></div>'),
    ("transform:scale(0)", "", '<p style="transform:scale(0)">{}</p>'),
    ("transform:scaleY(0)", "", '<p style="transform: translateX(1px) scaleY(0)">{}</p>'),
    ("clip-path:inset(100%)", "", '<p style="clip-path:inset(100%)">{}</p>'),
    ("clip:rect(0 0 0 0)", "", '<p style="position:absolute;clip:rect(0 0 0 0)">{}</p>'),
    ("left:-9999px", "", '<p style="position:absolute; left:-9999px">{}</p>'),
    ("text-indent:-100em", "", '<p style="text-indent:-100em">{}</p>'),
    ("height:0 overflow:hidden", "", '<div style="height:0;overflow:hidden"><p>{}</p></div>'),
    ("class rule", ".gone { display: none }", '<p class="gone">{}</p>'),
    ("id rule", "#trap{visibility:hidden}", '<p id="trap">{}</p>'),
    ("rule after @import", '@import url("x.css"); .promo { display:none }', '<p class="promo">{}</p>'),
    ("descendant rule", ".box > p { font-size: 0 }", '<div class="box"><p>{}</p></div>'),
    ("rule in @media screen", "@media screen { .m { opacity: 0 } }", '<p class="m">{}</p>'),
    ("attribute rule with comment", "/* x */ [data-x] { color: transparent !important }", '<p data-x="1">{}</p>'),
    ("hidden attribute", "", "<p hidden>{}</p>"),
    ("font-size:2px", "", '<p style="font-size:2px">{}</p>'),
    ("transform:translate(-9999px,0)", "", '<p style="transform:translate(-9999px,0)">{}</p>'),
    ("nested & rule", ".card { color: black; & span { display: none } }", '<p class="card"><span>{}</span></p>'),
    ("nested rule without &", ".box2 { em { visibility: hidden } }", '<p class="box2"><em>{}</em></p>'),
    ("filter:blur(30px)", "", '<p style="filter: blur(30px)">{}</p>'),
    ("zoom:0.01", "", '<p style="zoom:0.01">{}</p>'),
]

# Look-alikes a reader sees: they must stay.
SHOWN: list[tuple[str, str, str]] = [
    ("font-size:12px", "", '<p style="font-size:12px">{}</p>'),
    ("opacity:0.5", "", '<p style="opacity: 0.5">{}</p>'),
    ("white on black", "", '<p style="color: white; background: black">{}</p>'),
    ("hover rule", ".tip:hover { display: none }", '<p class="tip">{}</p>'),
    ("print rule", "@media print { .screen-only { display: none } }", '<p class="screen-only">{}</p>'),
    ("scale(1)", "", '<p style="transform: scale(1)">{}</p>'),
    ("left:10px", "", '<p style="position:relative; left:10px">{}</p>'),
    ("font shorthand", "", '<p style="font: bold 14px/1.4 serif">{}</p>'),
    ("font-size:10px", "", '<p style="font-size:10px">{}</p>'),
    ("translate(10px,0)", "", '<p style="transform: translate(10px, 0)">{}</p>'),
    ("nested rule that shows", ".card2 { & span { color: red } }", '<p class="card2"><span>{}</span></p>'),
    ("filter:blur(1px)", "", '<p style="filter: blur(1px)">{}</p>'),
    ("zoom:1.5", "", '<p style="zoom:1.5">{}</p>'),
]


def page(cases: list[tuple[str, str, str]], word: str) -> bytes:
    """One page holding every case, the n-th holding `word` + n."""
    styles = "\n".join(sheet for _, sheet, _ in cases if sheet)
    body = "\n".join(fragment.format(f"{word}{i} text") for i, (_, _, fragment) in enumerate(cases))
    return f"<html><head><style>{styles}</style></head><body><p>Visible intro.</p>\n{body}\n</body></html>".encode()
