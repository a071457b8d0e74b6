"""What the extractive prompt shows of a source: the rows a question names, the sentence holding its terms,
and which sources go in (rag.answering.focus, rag.answering.prompt.take_sources). Pure text logic."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rag.answering.focus import focus, named_cell, named_rows, sentence_first
from rag.answering.prompt import CompletionStyle, take_sources
from rag.answering.spans import is_span, span_grammar

SERVICES = """socks\t\t1080/tcp\t\t\t# socks proxy server
imap2\t\t143/tcp\t\timap\t\t# Interim Mail Access P 2 and 4
imaps\t\t993/tcp\t\t\t\t# IMAP over SSL
pop3s\t\t995/tcp\t\t\t\t# POP-3 over SSL
openvpn\t\t1194/tcp
"""
TABLE = (
    "Table 1: Ports\n| Service | Port | Description |\n| --- | --- | --- |\n"
    "| socks | 1080/tcp | socks proxy |\n| imaps | 993/tcp | IMAP over SSL |\n| pop3s | 995/tcp | POP-3 over SSL |"
)
SHADOW = (
    "The date of expiration of the account, expressed as the number of days since Jan 1, 1970. "
    "An empty field means that the account never expires. The value 0 should not be used."
)


def test_a_listing_shows_the_line_the_question_names():
    assert named_rows(SERVICES, "imaps port?") == "imaps\t\t993/tcp\t\t\t\t# IMAP over SSL"


def test_a_markdown_table_shows_the_named_row_with_each_cell_under_its_header():
    assert named_rows(TABLE, "imaps port?") == "Service: imaps; Port: 993/tcp; Description: IMAP over SSL"
    assert (
        named_rows(TABLE, "Which service is on 995/tcp?")
        == "Service: pop3s; Port: 995/tcp; Description: POP-3 over SSL"
    )


def test_a_question_naming_no_row_leaves_the_table_whole():
    assert named_rows(TABLE, "What is the caption of the table?") is None
    assert focus(TABLE, "What does the table list?", "rows") == TABLE


def test_a_table_beside_prose_is_not_cut_to_its_rows():
    prose = " ".join(["The services below are the ones the mail gateway runs."] * 3)
    text = f"{prose}\n{prose}\n{prose}\n{prose}\n{prose}\n{TABLE}"
    assert named_rows(text, "imaps port?") is None


def test_wrapped_prose_is_no_listing():
    wrapped = "\n".join(["An empty field means that the account never expires and can be used"] * 6)
    assert named_rows(wrapped, "What does an empty field mean?") is None


def test_short_lines_without_fields_set_apart_show_the_named_line_with_the_lines_around_it():
    # fstab(5) as a PDF: an option's line, then its meaning; the option's line alone lost the meaning.
    options = (
        "defaults\nuse default options: rw, suid, dev, exec, auto, nouser, and async.\n"
        "noauto\ndo not mount when mount -a is given (e.g., at boot time)\nuser\nallow a user to mount"
    )
    shown = named_rows(options, "What does the noauto mount option do?")
    assert shown is not None and "noauto\ndo not mount when mount -a is given" in shown
    assert "allow a user" not in shown
    # An exit value comes before its meaning.
    exits = "EXIT VALUES\n0\nsuccess\n1\npermission denied\n15\ncan't find the shadow password file"
    assert named_rows(exits, "Which exit value means can't find the shadow password file?") == (
        "15\ncan't find the shadow password file"
    )


def test_prose_shows_the_sentence_holding_the_questions_terms_first():
    first = sentence_first(SHADOW, "empty account-expiry field means?")
    assert first.startswith("An empty field means that the account never expires.")
    assert sorted(first.split(". ")) == sorted(SHADOW.split(". "))  # nothing lost, only moved


def test_a_chinese_question_or_a_one_sentence_text_is_left_as_it_is():
    assert sentence_first(SHADOW, "空字段是什么意思？") == SHADOW
    assert sentence_first("One sentence only.", "What sentence?") == "One sentence only."


def test_the_completion_prompt_shows_the_focused_source_on_one_line():
    style = CompletionStyle(1).for_question("imaps port?")
    assert style.render_source("S1", TABLE, {}) == "[S1] Service: imaps; Port: 993/tcp; Description: IMAP over SSL\n"
    assert CompletionStyle(1, focus="off").for_question("imaps port?").render_source("S1", "a\nb", {}) == "[S1] a b\n"


@dataclass
class Hit:
    name: str
    coverage: float


def test_a_weak_first_source_brings_the_best_covering_one_after_it():
    hits = [Hit("S1", 0.3), Hit("S2", 0.35), Hit("S3", 0.9), Hit("S4", 0.6)]
    taken, left = take_sources(hits, 1, 1)
    assert [h.name for h in taken] == ["S1", "S3"] and [h.name for h in left] == ["S2", "S4"]


def test_a_first_source_covering_the_question_comes_alone():
    hits = [Hit("S1", 0.8), Hit("S2", 0.85), Hit("S3", 0.5)]
    taken, left = take_sources(hits, 1, 1)
    assert [h.name for h in taken] == ["S1"] and len(left) == 2
    assert take_sources(hits, None, 1) == (hits, [])  # no limit: every source that fits
    assert [h.name for h in take_sources(hits, 1, 0)[0]] == ["S1"]


SSHD = (
    "sshd_config options\n| Option | Default | Meaning |\n| --- | --- | --- |\n"
    "| MaxAuthTries | 6 | attempts per connection |\n| LoginGraceTime | 120 | seconds to log in |"
)


def test_a_table_question_naming_a_row_and_a_column_is_answered_by_their_cell():
    assert named_cell(SSHD, "default of MaxAuthTries?") == "6"
    assert named_cell(SSHD, "LoginGraceTime default?") == "120"


def test_a_question_naming_no_column_or_no_single_row_has_no_cell():
    assert named_cell(SSHD, "What is MaxAuthTries?") is None  # no column named
    assert named_cell(SSHD, "default of every option?") is None  # no row named
    assert named_cell(SERVICES, "imaps port?") is None  # a listing has no header to name


def test_an_answer_is_a_span_when_its_words_stand_together_in_a_source():
    sources = ["socks 1080/tcp # socks proxy server", "it decodes DER data with asn1_der_decoding."]
    assert is_span("1080/tcp", sources) and is_span("Socks proxy", sources)
    assert not is_span("8080", sources) and not is_span("der_decoding", sources)
    assert is_span("山海关", ["长城东起山海关。"]) and not is_span("嘉峪关", ["长城东起山海关。"])


def test_the_span_grammar_runs_through_one_source_and_stops_at_its_field_separators():
    grammar = span_grammar(["Option: MaxAuthTries; Default: 6", "长城"])
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    assert rules["s0w2"] == '"MaxAuthTries"'  # the ";" after it ends every span
    assert rules["s0w6"] == '"6"' and rules["s0w4"] == '"Default" (s0w5)?'
    assert rules["s1w0"] == '"长" (s1w1)?'  # Chinese: character after character, no blank between
    assert "s0w1 |" not in rules["root"]  # no span starts at the colon


def test_a_question_about_a_cells_content_is_no_cell_lookup():
    fields = (
        "| Field | Name | Meaning | An empty field means |\n| --- | --- | --- | --- |\n"
        "| 2 | encrypted password | A password field which starts with an exclamation mark means locked. | - |\n"
        "| 8 | account expiration date | The date of expiration of the account. | the account will never expire |"
    )
    # The row's key (its leftmost cell the question names) leaves "field" for two columns: the model reads it.
    assert named_cell(fields, "What does a password field that starts with an exclamation mark mean?") is None
    passwd = (
        "| Field | Name | Notes |\n| --- | --- | --- |\n"
        "| 2 | optional encrypted password | A lower-case x means the encrypted password is stored in /etc/shadow. |"
    )
    assert named_cell(passwd, "What does a lower-case x in the password field of /etc/passwd mean?") is None
    # Its key cell names the row; "empty" and "field" name the last column.
    assert (
        named_cell(fields, "What does an empty account expiration date field mean?") == "the account will never expire"
    )


SERVICES_TABLE = (
    "| Service | Port | Protocol | Aliases | Comment |\n| --- | --- | --- | --- | --- |\n"
    "| tinc | 655 | tcp |  | tinc control port |\n"
    "| ldaps | 636 | tcp |  | LDAP over SSL |\n| ldaps | 636 | udp |  |  |\n"
    "| submission | 587 | tcp |  | Submission [RFC4409] |\n"
    "| kerberos | 88 | tcp | kerberos5 krb5 | Kerberos v5 |\n| kerberos | 88 | udp | kerberos5 krb5 | Kerberos v5 |\n"
    "| x11 | 6000 | tcp | x11-0 | X Window System |\n| x11-1 | 6001 | tcp |  |  |\n| x11-2 | 6002 | tcp |  |  |"
)


@pytest.mark.parametrize(
    ("question", "cell"),
    [
        ("Which port does the ldaps service use?", "636"),  # not tinc's: "port" in its comment names a column
        ("Which port does the submission service use?", "587"),  # its comment names it too: the key is leftmost
        ("What aliases does the kerberos service have?", "kerberos5 krb5"),  # two rows, one answer
        ("Which port does the x11 service use?", "6000"),  # the row whose key is x11 alone
        ("Which service uses port 6001?", "x11-1"),
    ],
)
def test_a_cell_at_the_row_its_key_names_and_the_column_the_rest_names(question: str, cell: str) -> None:
    assert named_cell(SERVICES_TABLE, question) == cell


ERRORS = (
    "POSIX error constants#\n\n| Constant | Description |\n| --- | --- |\n"
    "| EACCES | Indicates that the operation did not have sufficient permissions. |\n"
    "| EADDRINUSE | Indicates that the network address is already in use. |\n"
    "| EADDRNOTAVAIL | Indicates that the network address is currently unavailable for use. |"
)
FIELDS = (
    "Fields of a line of /etc/shadow\n| Field | Name | Meaning |\n| --- | --- | --- |\n"
    "| 1 | login name | It must be a valid account name. |\n| 2 | encrypted password | Refer to crypt(3). |\n"
    "| 7 | password inactivity period | The number of days after a password has expired. |"
)


def test_a_question_naming_only_a_rows_key_is_answered_by_the_cell_right_of_it():
    assert named_cell(ERRORS, "What does the EADDRINUSE error constant indicate?") == (
        "Indicates that the network address is already in use."
    )
    assert named_cell(FIELDS, "What is field 7 of /etc/shadow?") == "password inactivity period"
    assert named_cell(FIELDS, "Who sets field 7 of /etc/shadow?") is None  # words beyond the table's own


def test_a_row_named_by_stems_alone_gives_no_cell_but_its_key():
    services = (
        "| Service | Port | Comment |\n| --- | --- | --- |\n"
        "| submissions | 465/tcp | Submission over TLS |\n| imaps | 993/tcp | IMAP over SSL |"
    )
    assert named_cell(services, "Which port does the submission service use?") is None
    assert named_cell(services, "Which service carries IMAP over SSL?") == "imaps"


def test_a_path_in_the_question_names_the_tables_file():
    passwd_rows = "| Field | Name |\n| --- | --- |\n| 7 | optional user command interpreter |"
    assert named_cell(passwd_rows, "What is field 7 of /etc/passwd?") == "optional user command interpreter"
    assert named_cell(FIELDS, "What is field 7 of /etc/passwd?") is None  # its caption names /etc/shadow
