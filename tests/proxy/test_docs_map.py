"""Issue 42: a docs map that cannot drift. Every file path and every module name the docs cite exists, and a name
cited inside a module (`proxy/host/flowbody.commit_body`, `proxy.routes.may_receive_credentials`) is defined
there. Read from README.md and every page of docs/ (ADRs included): a moved or renamed module fails here, not in
a newcomer's hands."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ROOTS = ("proxy", "addons", "tools_server", "tests", "bench", "scripts")

# `proxy/host/flowbody.py`, `proxy/windows/`, `proxy/app/launcher.run_up`, `addons/_flow.session_of`
PATH = re.compile(r"(?<![\w./~-])((?:{})/[\w/]*\w)(\.py|/|\.[A-Za-z_]\w*)?".format("|".join(ROOTS)))
# `proxy.routes.may_receive_credentials`, `proxy.app.cli:main` (module names in backticks)
DOTTED = re.compile(r"`((?:proxy|addons|tools_server)(?:\.\w+)+)(?::(\w+))?")
GENERATED = {"bench/results"}  # written by the benches (git-ignored)
CONFIG_KEYS = {"proxy.workers", "proxy.websocket"}  # the config file's keys (`proxy.workers 2`), not modules


@functools.cache
def names_in(path: Path) -> frozenset[str]:
    """The names a module defines at top level and its classes define (what a doc may cite as `module.name`)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(out)


def module_file(parts: list[str]) -> tuple[Path | None, list[str]]:
    """The longest prefix of `parts` that is a module or package of the repo, and the rest (names inside it)."""
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), parts[i:]
        if (base / "__init__.py").is_file():
            return base / "__init__.py", parts[i:]
        if base.is_dir() and i == len(parts):
            return base, []
    return None, parts


def problems_of(page: Path) -> list[str]:
    text = page.read_text()
    out = []
    for m in PATH.finditer(text):
        stem, tail = m.group(1), m.group(2) or ""
        if (text[m.end():m.end() + 1] in ("*", "<") or (REPO / f"{stem}{tail}").is_file()
                or stem.startswith(tuple(GENERATED))):
            continue  # a pattern (`bench/bench_<name>.py`), a file of another kind (`scripts/bootstrap.sh`), output
        if tail == ".py":
            if not (REPO / f"{stem}.py").is_file():
                out.append(f"{stem}.py")
        elif tail == "/" or not tail:
            if not ((REPO / stem).exists() or (REPO / f"{stem}.py").is_file()):
                out.append(stem + tail)
        else:  # `path/module.name`
            f, rest = module_file(stem.split("/"))
            name = tail[1:]
            if f is None or f.is_dir():
                out.append(stem + tail)
            elif name not in names_in(f) and not (f.parent / name).exists():
                out.append(f"{stem}{tail} (no `{name}` in {f.relative_to(REPO)})")
    for m in DOTTED.finditer(text):
        if m.group(1) in CONFIG_KEYS:
            continue
        parts = m.group(1).split(".")
        f, rest = module_file(parts)
        if f is None:
            out.append(m.group(1))
            continue
        rest = rest + ([m.group(2)] if m.group(2) else [])
        if rest and not f.is_dir() and rest[0] not in names_in(f):
            out.append(f"{m.group(0)[1:]} (no `{rest[0]}` in {f.relative_to(REPO)})")
    return out


def test_every_path_and_name_the_docs_cite_exists():
    missing = {page.relative_to(REPO).as_posix(): p for page in PAGES if (p := problems_of(page))}
    assert not missing, f"the docs cite what does not exist: {missing}"


def test_the_check_finds_a_moved_module(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See `proxy/flowbody.py`, `proxy/host/flowbody.py`, `proxy/host/flowbody.no_such_name` and "
                    "`proxy.runtime.Runtime`, `proxy.app.runtime.Runtime`.")
    assert problems_of(page) == ["proxy/flowbody.py",
                                 "proxy/host/flowbody.no_such_name (no `no_such_name` in proxy/host/flowbody.py)",
                                 "proxy.runtime.Runtime (no `runtime` in proxy/__init__.py)"]
