"""Make the documents of bench/real_docs/docs/ that are not copied as they are from a Debian machine.

The benchmark runs on the vendored files alone; this script only says how they were made, and makes them
again on a Debian 12 machine with `groff-base`, `manpages-zh`, `netbase`, `bash` and the project's venv:

    .venv/bin/python -m bench.real_docs.make_corpus

Made here (the rest of docs/ is copied from /usr/share/man, /usr/share/doc and /etc, see README.md):
- tables/services.html and tables/services.docx: /etc/services as one table (service, port, protocol,
  aliases, comment), as a web page and as a Word document (python-docx);
- tables/shadow-fields.html and tables/passwd-fields.docx: the fields of /etc/shadow and /etc/passwd, as
  their man pages describe them, one row a field;
- pdf/fstab.5.pdf: fstab(5) rendered by groff as text, laid out on A4 pages (matplotlib, text layer kept);
- scans/bash-README.Debian-scan.png: the first questions of bash's README.Debian as a flatbed scan;
- scans/cp.1-zh_CN-scan.pdf: the Chinese cp(1) page as an image-only PDF of four pages (no text layer).
"""

from __future__ import annotations

import gzip
import html
import subprocess
from datetime import datetime
from pathlib import Path

DOCS = Path(__file__).resolve().parent / "docs"

SHADOW_FIELDS = [
    ("1", "login name", "It must be a valid account name, which exist on the system.", "-"),
    (
        "2",
        "encrypted password",
        "Refer to crypt(3). A password field which starts with an exclamation mark means that the password is "
        "locked. A string that is not a valid result of crypt(3), for instance ! or *, means the user will not be "
        "able to use a unix password to log in.",
        "no passwords are required to authenticate as the specified login name",
    ),
    (
        "3",
        "date of last password change",
        "The number of days since Jan 1, 1970 00:00 UTC. The value 0 means that the user should change her "
        "password the next time she will log in the system.",
        "password aging features are disabled",
    ),
    (
        "4",
        "minimum password age",
        "The number of days the user will have to wait before she will be allowed to change her password again.",
        "there is no minimum password age (the value 0 means the same)",
    ),
    (
        "5",
        "maximum password age",
        "The number of days after which the user will have to change her password.",
        "there are no maximum password age, no password warning period, and no password inactivity period",
    ),
    (
        "6",
        "password warning period",
        "The number of days before a password is going to expire during which the user should be warned.",
        "there are no password warning period (the value 0 means the same)",
    ),
    (
        "7",
        "password inactivity period",
        "The number of days after a password has expired during which the password should still be accepted.",
        "there are no enforcement of an inactivity period",
    ),
    (
        "8",
        "account expiration date",
        "The date of expiration of the account, as the number of days since Jan 1, 1970 00:00 UTC. The value 0 "
        "should not be used.",
        "the account will never expire",
    ),
    ("9", "reserved field", "This field is reserved for future use.", "-"),
]

PASSWD_FIELDS = [
    ("1", "login name", "The name of the account."),
    ("2", "optional encrypted password", "A lower-case x means the encrypted password is stored in /etc/shadow."),
    ("3", "numerical user ID", "The user's UID."),
    ("4", "numerical group ID", "The user's primary GID."),
    (
        "5",
        "user name or comment field",
        "Also known as the gecos field; an ampersand is replaced by the capitalised login name.",
    ),
    ("6", "user home directory", "The initial working directory; login sets $HOME from it."),
    ("7", "optional user command interpreter", "login sets $SHELL from it; if empty, it defaults to /bin/sh."),
]


def services_rows(text: str) -> list[tuple[str, str, str, str, str]]:
    """(service, port, protocol, aliases, comment) for each entry line of /etc/services."""
    rows = []
    for line in text.splitlines():
        entry, _, comment = line.partition("#")
        fields = entry.split()
        if len(fields) < 2 or "/" not in fields[1]:
            continue
        port, _, protocol = fields[1].partition("/")
        rows.append((fields[0], port, protocol, " ".join(fields[2:]), comment.strip()))
    return rows


def html_table(title: str, caption: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cells = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    return (
        f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title></head>\n"
        f"<body><h1>{html.escape(title)}</h1>\n<table>\n<caption>{html.escape(caption)}</caption>\n"
        f"<thead><tr>{head}</tr></thead>\n<tbody>\n{cells}\n</tbody></table></body></html>\n"
    )


def docx_table(path: Path, title: str, intro: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    import docx

    document = docx.Document()
    document.core_properties.created = document.core_properties.modified = datetime(2026, 12, 2)
    document.add_heading(title, level=1)
    document.add_paragraph(intro)
    table = document.add_table(rows=1, cols=len(header))
    table.style = "Table Grid"
    for cell, text in zip(table.rows[0].cells, header):
        cell.text = text
    for row in rows:
        for cell, text in zip(table.add_row().cells, row):
            cell.text = text
    document.save(str(path))


def man_text(page: Path) -> str:
    troff = gzip.decompress(page.read_bytes())
    done = subprocess.run(
        ["groff", "-k", "-t", "-man", "-Tutf8", "-P-cbou"], input=troff, capture_output=True, check=True
    )
    return done.stdout.decode()


def text_pdf(path: Path, text: str, lines_per_page: int = 64) -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["pdf.fonttype"] = 42  # TrueType: a text layer that reads back as the text
    matplotlib.rcParams["svg.hashsalt"] = "real-docs"
    from matplotlib import pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    lines = text.splitlines()
    with PdfPages(path, metadata={"Creator": "bench/real_docs/make_corpus.py", "CreationDate": None}) as pdf:
        for start in range(0, len(lines), lines_per_page):
            figure = plt.figure(figsize=(8.27, 11.69))
            body = "\n".join(lines[start : start + lines_per_page])
            figure.text(0.08, 0.95, body, family="DejaVu Sans Mono", fontsize=8.5, va="top", linespacing=1.25)
            pdf.savefig(figure)
            plt.close(figure)


def scans() -> None:
    from tests import scans as render

    readme = gzip.decompress(Path("/usr/share/doc/bash/README.Debian.gz").read_bytes()).decode()
    start = readme.index("A kind of FAQ")
    faq = readme[start : readme.index("6. bash does not check")].split("\n\n")
    paragraphs = [" ".join(p.split()) for p in faq if p.strip() and not set(p.strip()) <= {"-"}]
    page = render.render_page(paragraphs, dpi=150, point_size=10)
    page = page.crop((0, 0, page.width, page.height * 2 // 3))
    image = render.scanned(page, seed=7, noise=6)
    (DOCS / "scans" / "bash-README.Debian-scan.png").write_bytes(render.image_bytes(image, "PNG", optimize=True))

    cp = [line.strip() for line in man_text(Path("/usr/share/man/zh_CN/man1/cp.1.gz")).splitlines() if line.strip()]
    cp = [line for line in cp if not line.startswith("CP(1)")]
    parts = [cp[i : i + 30] for i in range(0, len(cp), 30)]
    pages = [
        render.scanned(render.render_page(part, dpi=150, point_size=9), seed=11 + i) for i, part in enumerate(parts)
    ]
    (DOCS / "scans" / "cp.1-zh_CN-scan.pdf").write_bytes(render.image_pdf(pages, dpi=150))


def main() -> None:
    rows = services_rows(Path("/etc/services").read_text())
    header = ("Service", "Port", "Protocol", "Aliases", "Comment")
    caption = "Internet network services (/etc/services of Debian 12, netbase)"
    (DOCS / "tables" / "services.html").write_text(html_table("Network services", caption, header, rows))
    docx_table(DOCS / "tables" / "services.docx", "Network services", caption, header, rows)
    (DOCS / "tables" / "shadow-fields.html").write_text(
        html_table(
            "The fields of /etc/shadow",
            "Fields of a line of /etc/shadow, from shadow(5)",
            ("Field", "Name", "Meaning", "An empty field means"),
            SHADOW_FIELDS,
        )
    )
    docx_table(
        DOCS / "tables" / "passwd-fields.docx",
        "The fields of /etc/passwd",
        "Each line of /etc/passwd has seven fields separated by colons, from passwd(5).",
        ("Field", "Name", "Notes"),
        PASSWD_FIELDS,
    )
    text_pdf(DOCS / "pdf" / "fstab.5.pdf", man_text(Path("/usr/share/man/man5/fstab.5.gz")))
    scans()


if __name__ == "__main__":
    main()
