"""The demo's training text: English that ships with the operating system and Python.

Why a module of its own: `scripts/train_demo.py` trains, this one decides what it reads
and what it must never read. Sources (licences in docs/quality.md):
- the GNU manuals in /usr/share/info (GNU FDL), less their licence appendices;
- Vim's help (/usr/share/vim/vim90/doc; Vim licence / Open Publication License);
- the Python standard library's docstrings and pydoc topics (PSF License);
- the manual pages in /usr/share/man/man1-8 (each package's own licence, recorded in
  /usr/share/doc/PACKAGE/copyright; Debian ships them as free documentation);
- the prose documentation in /usr/share/doc (READMEs, Markdown, reStructuredText, text
  and HTML guides; changelogs and copyright files left out);
- the licence texts in /usr/share/common-licenses, less the held-out ones.

Held out, never read for training: the GPL-3 and Apache-2.0 texts, the LGPL-3 (a set of
permissions added to the GPL-3, quoting it), the sed and grep manuals (info and man
pages), and this project's own prose (README.md, docs/). On top of leaving those files
out, every training paragraph that shares any run of eight words with a held-out text
is dropped (`Decontaminator`): licence notices quoted in other files, say.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import html
import re
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

INFO_DIR = Path("/usr/share/info")
VIM_DOC = Path("/usr/share/vim/vim90/doc")
MAN_DIR = Path("/usr/share/man")
DOC_DIR = Path("/usr/share/doc")
LICENCES = Path("/usr/share/common-licenses")

HELDOUT_MANUALS = ("sed.info", "grep.info")
HELDOUT_MAN_PAGES = ("sed", "grep", "egrep", "fgrep", "rgrep")
HELDOUT_LICENCES = ("GPL-3", "Apache-2.0", "LGPL-3")
_SKIP_NODES = ("GNU Free Documentation License", "Copying This Manual", "Copying")
SHINGLE = 8


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of running text: lines joined, menus, tables and code dropped."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
        if not lines or any(
            ln.startswith(("* ", "File:", "\x1f", "Tag Table", "--")) for ln in lines
        ):
            continue
        para = " ".join(lines)
        if "\t" in para:  # tables
            continue
        para = re.sub(r"\s{2,}", " ", para)
        letters = sum(c.isalpha() or c == " " for c in para)
        if len(para) < 60 or letters < 0.85 * len(para) or para.count(" ") < 8:
            continue
        out.append(para)
    return out


def _info_manual(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    keep = []
    for node in raw.split("\x1f"):
        head = node.strip().splitlines()[0] if node.strip() else ""
        if any(f"Node: {s}" in head for s in _SKIP_NODES):
            continue
        keep.append(node)
    return "\n".join(keep)


def info_texts(heldout: bool) -> list[str]:
    paras: list[str] = []
    for f in sorted(INFO_DIR.glob("*.info*.gz")):
        base = re.sub(r"(-\d+)?\.gz$", "", f.name)
        if (base in HELDOUT_MANUALS) != heldout:
            continue
        paras += prose_paragraphs(_info_manual(f))
    return paras


def python_texts() -> list[str]:
    """Docstrings of the standard library and the pydoc topics (the language reference)."""
    paras: list[str] = []
    try:
        from pydoc_data.topics import topics

        for t in topics.values():
            paras += prose_paragraphs(t)
    except ImportError:
        pass
    lib = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(lib.glob("*.py")) + sorted(lib.glob("*/*.py")):
        if any(p in f.parts for p in ("test", "tests", "idlelib", "site-packages", "lib2to3")):
            continue
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    paras += prose_paragraphs(doc)
    return paras


def vim_texts() -> list[str]:
    """Vim's help, markup removed: *tags* dropped, |links| and `code` kept as words."""
    paras: list[str] = []
    for f in sorted(VIM_DOC.glob("*.txt")):
        text = f.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"\*[^*\s]+\*", "", text)
        text = re.sub(r"\|([^|\s]+)\|", r"\1", text)
        text = re.sub(r"`([^`]+)`", r"\1", text)
        paras += prose_paragraphs(text)
    return paras


_ROFF_ESCAPES = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\s[+-]?\d"), ""),  # size changes
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),  # strings
    (re.compile(r"\\\((em|en)"), "-"),
    (re.compile(r"\\\((lq|rq|dq)"), '"'),
    (re.compile(r"\\\((oq|cq|aq)"), "'"),
    (re.compile(r"\\\(.."), ""),
    (re.compile(r"\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[-e]"), lambda m: "-" if m.group(0) == "\\-" else "\\"),
    (re.compile(r"\\[&|^,/%:]"), ""),
    (re.compile(r"\\ "), " "),
]


def roff_to_text(src: str) -> str:
    """A manual page's running text: requests dropped (font macros keep their words),
    escapes resolved roughly; .PP/.SH/.TP start new paragraphs."""
    out: list[str] = []
    for line in src.splitlines():
        if line.startswith(('.\\"', "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            m = re.match(r"[.'](\w+)\s*(.*)", line)
            if not m:
                continue
            req, rest = m.group(1), m.group(2)
            if req in ("B", "I", "BI", "BR", "IB", "IR", "RB", "RI", "SM", "SB"):
                out.append(rest.replace('"', ""))
            elif req in ("SH", "SS"):
                out.append("")
            elif req in ("PP", "P", "LP", "TP", "IP", "HP", "sp", "br", "TH", "RS", "RE"):
                out.append("")
            continue
        out.append(line)
    text = "\n".join(out)
    for pat, rep in _ROFF_ESCAPES:
        text = pat.sub(rep, text)
    return text


def man_texts() -> list[str]:
    """Manual pages, sections 1-8; of the 16,000-odd generated `gcloud` pages (one
    command each, much the same text) only every 40th."""
    paras: list[str] = []
    gcloud = 0
    for sec in sorted(MAN_DIR.glob("man[1-8]")):
        for f in sorted(sec.glob("*.gz")):
            name = f.name.split(".")[0]
            if name in HELDOUT_MAN_PAGES or f.is_symlink():
                continue
            if name.startswith("gcloud"):
                gcloud += 1
                if gcloud % 40:
                    continue
            try:
                src = gzip.decompress(f.read_bytes()).decode("utf-8", "replace")
            except (OSError, EOFError):
                continue
            if src.startswith(".so "):  # an alias page
                continue
            paras += prose_paragraphs(roff_to_text(src))
    return paras


_DANGLING = {"of", "the", "a", "an", "for", "to", "into", "and", "or", "with", "in", "on"}
_NAME_LINE = re.compile(r"^\.SH\s+\"?NAME\"?\s*$", re.M)


def man_summaries() -> list[tuple[str, str]]:
    """(command, what it does) from the NAME line of each section-1 and -8 manual page
    ("cp \\- copy files and directories"): the facts the demo's plain answers are made
    of (scripts/demo_dialogues.py). Held-out pages and gcloud's generated ones are left
    out; the summary must read as words (no markup, 12 to 80 characters)."""
    out: dict[str, str] = {}
    for sec in ("man1", "man8"):
        for f in sorted((MAN_DIR / sec).glob("*.gz")):
            name = f.name.split(".")[0]
            if name in HELDOUT_MAN_PAGES or name.startswith("gcloud") or f.is_symlink():
                continue
            try:
                src = gzip.decompress(f.read_bytes()).decode("utf-8", "replace")
            except (OSError, EOFError):
                continue
            m = _NAME_LINE.search(src)
            if not m:
                continue
            line = src[m.end() :].lstrip("\n").split("\n", 1)[0]
            cmd, sep, what = line.partition("\\-")
            cmd, what = cmd.split(",")[0].strip().replace("\\", ""), what.strip().rstrip(".")
            if not sep or not re.fullmatch(r"[a-z][a-z0-9_+-]{1,24}", cmd) or cmd in out:
                continue
            words = what.split()
            if (
                12 <= len(what) <= 80
                and re.fullmatch(r"[A-Za-z][A-Za-z0-9 ,'()/-]+", what)
                and not what.lower().startswith("manual page")
                and words[-1] not in _DANGLING
            ):
                out[cmd] = what
    return sorted(out.items())


_DOC_SKIP = re.compile(r"(change|history|news|copyright|copying|licen[cs]e|authors|thanks)", re.I)
_DOC_KEEP = re.compile(r"\.(md|txt|rst|html?|text)(\.gz)?$|^readme", re.I)


def _html_text(src: str) -> str:
    src = re.sub(r"(?is)<(script|style|pre|code)[^>]*>.*?</\1>", " ", src)
    src = re.sub(r"(?i)</?(p|div|h\d|li|br|tr|section|article|dd|dt)[^>]*>", "\n\n", src)
    src = re.sub(r"<[^>]+>", "", src)
    return html.unescape(src)


def doc_texts() -> list[str]:
    """Prose in /usr/share/doc (each package's documentation)."""
    paras: list[str] = []
    for f in sorted(DOC_DIR.rglob("*")):
        if not f.is_file() or f.is_symlink() or _DOC_SKIP.search(f.name):
            continue
        if not _DOC_KEEP.search(f.name) or f.name == "all.html":  # node's all.html repeats api/
            continue
        try:
            raw = f.read_bytes()
            if f.suffix == ".gz":
                raw = gzip.decompress(raw)
        except (OSError, EOFError):
            continue
        text = raw.decode("utf-8", "replace")
        if re.search(r"\.html?(\.gz)?$", f.name, re.I):
            text = _html_text(text)
        elif re.search(r"\.md(\.gz)?$", f.name, re.I):
            text = re.sub(r"(?s)```.*?```", " ", text)
            text = re.sub(r"`([^`]+)`", r"\1", text)
            text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
        paras += prose_paragraphs(text)
    return paras


def licence_texts() -> list[str]:
    paras: list[str] = []
    for f in sorted(LICENCES.iterdir()):
        if f.is_symlink() or f.name in HELDOUT_LICENCES:
            continue
        paras += prose_paragraphs(f.read_text(encoding="utf-8", errors="replace"))
    return paras


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _shingles(words: list[str]) -> Iterator[bytes]:
    for i in range(len(words) - SHINGLE + 1):
        yield hashlib.blake2b(" ".join(words[i : i + SHINGLE]).encode(), digest_size=8).digest()


class Decontaminator:
    """Drops a paragraph that shares any run of SHINGLE words with a held-out text."""

    def __init__(self, heldout: Iterable[str]) -> None:
        self.seen: set[bytes] = set()
        for text in heldout:
            self.seen.update(_shingles(_words(text)))
        self.dropped = 0

    def clean(self, paras: Iterable[str]) -> list[str]:
        out = []
        for p in paras:
            if any(s in self.seen for s in _shingles(_words(p))):
                self.dropped += 1
            else:
                out.append(p)
        return out


def heldout_texts(project: Path) -> dict[str, str]:
    """The held-out texts by name (what the demo is measured on, never trained on)."""
    texts = {name: (LICENCES / name).read_text() for name in HELDOUT_LICENCES}
    texts["manuals"] = "\n\n".join(info_texts(heldout=True))
    for f in [project / "README.md", *sorted((project / "docs").glob("*.md"))]:
        texts[f"project:{f.name}"] = f.read_text()
    return texts


def training_sources() -> dict[str, list[str]]:
    """Every training source's paragraphs, by source name (before decontamination)."""
    return {
        "info": info_texts(heldout=False),
        "vim": vim_texts(),
        "python": python_texts(),
        "man": man_texts(),
        "doc": doc_texts(),
        "licences": licence_texts(),
    }
