"""Definition lists of man pages (rag.answering.definitions): the meaning of the option or exit value a
question names, and the option a question asks for by what it does. Pure text logic, on slices of the
man pages the benchmark in bench/real_docs indexes."""

from __future__ import annotations

from rag.answering.definitions import entries, first_answering, named_documents, named_entry

GZIP = """-d --decompress --uncompress
       Decompress.

-k --keep
       Keep (don't delete) input files during compression or decompression.

-l --list
       For each compressed file, list the following fields:

           compressed size: size of the compressed file

-t --test
       Test. Check the compressed file integrity then quit.
"""
LS_ZH = """-t     按时间排序，最新的最前；参见 --time

-T, --tabsize=列数
       指定制表符宽度为给定列数，而非默认的 8

-S     按文件大小排序，最大的最前

-s, --size
       显示给每个文件分配的大小，单位为块
"""
EXIT_VALUES = """The useradd command exits with the following values:

0
    success

4
    UID already in use (and no -o)

9
    username or group name already in use
"""
PROSE = """ADVANCED USAGE

Then

      gunzip -c foo

is equivalent to

      cat file1 file2

compresses better than

      gzip -c file1 file2 > foo.gz
"""


def test_an_entry_is_a_term_line_and_its_indented_or_spaced_meaning():
    found = entries(LS_ZH)
    assert [e.term for e in found] == ["-t", "-T, --tabsize=列数", "-S", "-s, --size"]
    assert found[1].names == {"-T", "--tabsize"} and found[0].meaning == "按时间排序，最新的最前；参见 --time"


def test_the_option_a_question_names_is_answered_by_its_meaning_as_written():
    assert named_entry(LS_ZH, "ls 的 -t 选项做什么？") == "按时间排序，最新的最前"
    assert named_entry(LS_ZH, "What does ls -T do?") == "指定制表符宽度为给定列数，而非默认的 8"
    assert (
        named_entry(GZIP, "And what does its -t option do?") == "Test. Check the compressed file integrity then quit."
    )


def test_the_option_a_question_asks_for_is_the_one_whose_meaning_says_it():
    assert named_entry(GZIP, "Which gzip option keeps the input files instead of deleting them?") == "-k --keep"
    assert named_entry(GZIP, "Which gzip option checks the compressed file integrity?") == "-t --test"
    assert named_entry(LS_ZH, "ls 用哪个选项根据文件大小排序？") == "-S"


def test_an_exit_value_is_named_by_its_number_only_in_a_question_about_exit_or_return_values():
    assert (
        named_entry(EXIT_VALUES, "What does exit value 9 of useradd mean?") == "username or group name already in use"
    )
    assert named_entry(EXIT_VALUES, "Which exit value does useradd return when the UID is already in use?") == "4"
    assert named_entry(EXIT_VALUES, "What does the value 0 in the date field mean?") is None


def test_no_answer_where_no_one_entry_answers():
    assert named_entry(GZIP, "Which gzip option gives the best compression?") is None  # not in this slice
    assert named_entry(GZIP, "How much memory does bzip2 use for the flag -9 without -s?") is None  # two options
    assert named_entry(GZIP, "What does -x do?") is None
    assert named_entry(PROSE, "What is equivalent to gunzip -c foo?") is None  # prose over examples: no list


def test_the_first_text_holding_the_named_option_or_the_one_asked_for_is_found_for_the_prompt():
    assert first_answering([GZIP, LS_ZH], "ls 的 -S 选项做什么？") == 1
    assert first_answering([GZIP, LS_ZH], "What does -k do?") == 0
    assert first_answering([GZIP, LS_ZH], "What does -x do?") is None
    assert first_answering([LS_ZH, GZIP], "Which gzip option checks the compressed file integrity?") == 1


def test_a_question_naming_a_command_names_its_man_page():
    sources = ["man/zh_CN/ls.1.gz", "scans/cp.1-zh_CN-scan.pdf", "pdf/bzip2-manual.pdf"]
    assert named_documents("cp 的 -x 选项做什么？", sources) == {"scans/cp.1-zh_CN-scan.pdf"}
    assert named_documents("How much memory does bzip2 use?", sources) == {"pdf/bzip2-manual.pdf"}
    assert named_documents("What does -x do?", sources) == set()


FSTAB_PDF = """ Basic filesystem-independent options are:
 defaults
 use default options: rw, suid, dev, exec, auto, nouser, and async.
 noauto
 do not mount when mount -a is given (e.g., at boot time)
 user
 allow a user to mount
 owner
 allow device owner to mount
"""
BZIP2_PDF = """BZ_DATA_ERROR
if a data integrity error was detected in the compressed stream
BZ_DATA_ERROR_MAGIC
if the stream does not begin with the requisite header bytes
(ie, is not a bzip2 data file). This is really
a special case of BZ_DATA_ERROR.
BZ_MEM_ERROR
if insufficient memory is available
"""


def test_a_pdf_list_of_one_word_terms_answers_for_an_identifier_or_a_word_called_an_option():
    assert named_entry(FSTAB_PDF, "What does the noauto mount option do?") == (
        "do not mount when mount -a is given (e.g., at boot time)"
    )
    assert named_entry(BZIP2_PDF, "What does BZ_DATA_ERROR_MAGIC mean?") == (
        "if the stream does not begin with the requisite header bytes (ie, is not a bzip2 data file)."
    )
    assert named_entry(FSTAB_PDF, "Can a user mount it?") is None  # a plain word is no name


CP_SCAN = (  # an image-only PDF page of cp(1) in Chinese as OCR reads it: its lines joined into one run
    "必选参数对长短选项同时适用。-a, --archive与-dR--preserve=all相同。--attributes-only不要复制文件数据，"
    "仅仅复制其属性值。-b 类似--backup，但是不接受参数-d 与--no-dereference--preserve=links 相同-1, --link"
    "使用硬链接取代复制-L, --dereference总是跟随源文件中的符号链接-n, --no-clobber"
)


def test_an_ocr_run_of_options_is_read_as_a_list():
    assert [e.term for e in entries(CP_SCAN)] == [
        "-a, --archive",
        "--attributes-only",
        "-b",
        "-d",
        "-1, --link",
        "-L, --dereference",
    ]
    assert named_entry(CP_SCAN, "cp 的 -a 选项与什么相同？") == "与-dR--preserve=all相同。"
    assert named_entry(CP_SCAN, "cp 的哪个选项使用硬链接取代复制？") == "-1, --link"
    assert named_entry(CP_SCAN, "cp 的 -n 选项做什么？") is None  # its meaning is on the next page
    assert entries("使用 -l 时显示的时间格式，与 --full-time 相同") == []  # prose naming options


USERADD_E = """-e, --expiredate EXPIRE_DATE
    The date on which the user account will be disabled. The date is specified in the format YYYY-MM-DD.

-f, --inactive INACTIVE
    The number of days after a password expires until the account is permanently disabled.
"""


def test_a_which_question_about_a_named_option_gets_the_sentence_of_its_meaning_that_answers():
    assert named_entry(USERADD_E, "In which format is the expiry date given to useradd -e?") == (
        "The date is specified in the format YYYY-MM-DD."
    )
    assert named_entry(GZIP, "Which command is identical to gzip -d?") is None  # asks for a term


PG_COMMANDS = """For managing clusters, the following commands are provided (each with its own
manual page):

   pg_createcluster  - Create a new cluster or integrate an existing one into
                       the postgresql-common architecture.
   pg_dropcluster    - Completely remove a cluster.
   pg_lsclusters     - Show a list of all existing clusters and their status.
   pg_upgradecluster - Migrate a cluster from one major version to another one.
   pg_renamecluster  - Rename a cluster.

Please note that you can of course still use the upstream tools for creating
clusters, such as initdb(1).
"""


def test_a_dashed_list_of_commands_answers_which_command_does_something():
    found = entries(PG_COMMANDS)
    assert [e.term for e in found] == [
        "pg_createcluster",
        "pg_dropcluster",
        "pg_lsclusters",
        "pg_upgradecluster",
        "pg_renamecluster",
    ]
    assert (
        found[0].meaning == "Create a new cluster or integrate an existing one into the postgresql-common architecture."
    )
    question = "Which command migrates a PostgreSQL cluster from one major version to another?"
    assert named_entry(PG_COMMANDS, question) == "pg_upgradecluster"
    # A clusters-and-ports question that no one meaning says more of than the others: no answer read.
    assert named_entry(PG_COMMANDS, "Which command displays the cluster to port mapping?") is None
    # Options are not what "which command" asks for, nor commands what "which option" asks for.
    assert named_entry(GZIP, "Which command keeps the input files?") is None
    assert named_entry(PG_COMMANDS, "Which option removes a cluster completely?") is None


GROUPS_PAGE = """tty

Tty devices and /dev/vcs* are owned by this group. This is used by write and wall to enable them to write to
other people's ttys.

disk

Raw access to disks. Mostly equivalent to root access.

HELP: Well, I have some disk devices in /dev owned by the group, but I can't see the point.
"""


def test_a_word_the_question_calls_a_group_names_its_entry_and_the_noun_asks_for_nothing():
    # Two entries where a chunk ends are enough when the question says what the word is ("the disk group");
    # "group" is the kind, so the HELP sentence that says "the group" is not the one asked for.
    assert named_entry(GROUPS_PAGE, "What is the disk group for?") == "Raw access to disks."
    assert named_entry(GROUPS_PAGE, "What is disk for?") is None  # a plain word is no name
