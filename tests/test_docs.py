"""The docs as references: every page indexed, every link and cited path alive, every record cited.

What it checks, over README.md and docs/ (no network, no model; a second at most):
- every page under docs/ is linked from docs/README.md, the index;
- every relative link (and image) in README.md and the docs' pages resolves to a file, and a
  link's #anchor to a heading of the page it names;
- every path under docs/ that a page, or the code (megatron_rlep/, benchmarks/, studies/, tools/,
  tests/, scripts/, slurm/, conf/), names exists (a record, a page; a glob matches something);
- every file of the code that a page or the code names exists, or is named where git keeps it
  (``git show REV:PATH`` in the same text, REV holding PATH);
- records (JSON, PNG, JSONL) live in folders by study under docs/records/, none loose in docs/,
  and every one is cited by some page;
- no page is longer than 400 lines.
What it must not do: judge what a page says.
"""
import fnmatch
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MAX_LINES = 400
# paths that look like this repository's docs/ but are another project's
NOT_OURS = {"docs/advance/one_step_off.md", "docs/advance/fully_async.md"}  # verl's documentation
CODE_DIRS = ("megatron_rlep", "benchmarks", "studies", "tools", "tests", "scripts", "slurm", "conf")
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".sbatch", ".md", ".txt", ".cfg"}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# a file of the code (metric names such as tools/ok_share have no suffix: not paths)
CODE_PATH = re.compile(r"(?<![\w/.$-])(?:" + "|".join(CODE_DIRS) + r")/[\w./*-]*"
                       r"\.(?:py|sh|yaml|sbatch|md|txt|cfg|json|jsonl|parquet)(?![\w/])")
IN_GIT = re.compile(r"git show\s+(\w+):(\S+?\.\w+)")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./*-]*\w")


def pages():
    return sorted(DOCS.rglob("*.md"))


def records():
    return sorted(p for p in (DOCS / "records").rglob("*") if p.is_file())


def rel(path):
    return path.relative_to(REPO).as_posix()


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", page.read_text(), re.M)}


def links(page):
    """(target path, anchor or None) of each relative link of a page."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        yield (page.parent / path).resolve() if path else page, anchor or None


def cited_paths(text):
    return {m.group(0).rstrip(".") for m in DOCS_PATH.finditer(text)} - NOT_OURS


def test_every_page_is_in_the_index():
    index = DOCS / "README.md"
    linked = {target for target, _ in links(index)}
    missing = [rel(p) for p in pages() if p != index and p.resolve() not in linked]
    assert not missing, f"pages docs/README.md does not link: {missing}"


def test_every_relative_link_resolves():
    broken = []
    for page in [REPO / "README.md", *pages()]:
        for target, anchor in links(page):
            if not target.exists():
                broken.append(f"{rel(page)} -> {target}")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{rel(page)} -> {rel(target)}#{anchor}")
    assert not broken, f"links to nothing: {broken}"


def code_and_pages() -> list[Path]:
    sources = [REPO / "README.md", *pages()]
    for folder in CODE_DIRS:
        sources += [p for p in (REPO / folder).rglob("*") if p.suffix in CODE_SUFFIXES and p.is_file()]
    return sources


def test_every_docs_path_named_exists():
    sources = code_and_pages()
    files = [rel(p) for p in DOCS.rglob("*") if p.is_file()]
    dirs = {rel(p) for p in DOCS.rglob("*") if p.is_dir()} | {"docs"}
    missing = []
    for source in sources:
        for path in cited_paths(source.read_text(errors="replace")):
            found = fnmatch.filter(files, path) if "*" in path else path in files or path in dirs
            if not found:
                missing.append(f"{rel(source)}: {path}")
    assert not missing, f"paths under docs/ that do not exist: {missing}"


def test_every_code_path_named_exists():
    """The platform module's file named after it became a package, a benchmark's command after
    the script was removed: a reader finds nothing there."""
    missing, in_git = [], set()
    for source in code_and_pages():
        text = source.read_text(errors="replace")
        kept = dict((path, rev) for rev, path in IN_GIT.findall(text))
        in_git |= set(kept.items())
        for path in set(CODE_PATH.findall(text)):
            found = list(REPO.glob(path)) if "*" in path else (REPO / path).exists()
            if not found and path not in kept:
                missing.append(f"{rel(source)}: {path}")
    assert not missing, f"paths of the code that do not exist: {missing}"
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO,
                             capture_output=True, text=True).stdout.strip()
    if shallow == "false":  # a full clone: git keeps what the texts say it keeps
        lost = [f"{rev}:{path}" for path, rev in sorted(in_git) if subprocess.run(
            ["git", "cat-file", "-e", f"{rev}:{path}"], cwd=REPO).returncode]
        assert not lost, f"git show names what git does not hold: {lost}"


def test_records_are_in_folders_by_study_and_each_is_cited():
    loose = [p.name for p in DOCS.iterdir() if p.is_file() and p.suffix != ".md"]
    assert not loose, f"records belong in docs/records/<study>/, not in docs/: {loose}"
    flat = [rel(p) for p in records() if p.parent == DOCS / "records"]
    assert not flat, f"records belong in a study's folder under docs/records/: {flat}"
    cited = set()
    for page in [REPO / "README.md", *pages()]:
        cited |= cited_paths(page.read_text())
        cited |= {rel(target) for target, _ in links(page) if target.is_relative_to(REPO)}
    uncited = [rel(p) for p in records()
               if rel(p) not in cited and not any(fnmatch.fnmatch(rel(p), c) for c in cited if "*" in c)]
    assert not uncited, f"records no page cites: {uncited}"


def test_no_page_is_longer_than_400_lines():
    long = {rel(p): n for p in pages() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"pages over {MAX_LINES} lines (split them by topic): {long}"
