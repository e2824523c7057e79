"""Issue 29: no import loop among proxy/ and addons/ modules (DESIGN's rooms; ADR 0011). The loop that
started at proxy/app/runtime.py → proxy/bridge/server.py (→ flowstate → compaction → runtime) is gone, and
none may come back. grimp is the graph import-linter builds (its TYPE_CHECKING imports count too)."""

from __future__ import annotations

import grimp


def test_no_module_of_proxy_or_addons_imports_itself_back():
    graph = grimp.build_graph("proxy", "addons")
    loops = sorted((m, imp) for m in graph.modules for imp in graph.find_modules_directly_imported_by(m)
                   if graph.find_shortest_chain(importer=imp, imported=m))
    chains = {(m, imp): graph.find_shortest_chain(importer=imp, imported=m) for m, imp in loops[:3]}
    assert not loops, f"import loops: {chains}"


def test_no_module_of_the_tool_server_imports_itself_back():
    # credentials ↔ registry (UpstreamAccess now lives with the credential rule) and discovery ↔ the one road
    # (the family answers held_back itself) were the last two.
    graph = grimp.build_graph("tools_server", "proxy")
    loops = sorted((m, imp) for m in graph.modules if m.startswith("tools_server")
                   for imp in graph.find_modules_directly_imported_by(m)
                   if graph.find_shortest_chain(importer=imp, imported=m))
    assert not loops, f"import loops: {loops[:3]}"


def test_no_loop_of_rooms_inside_proxy():
    """Issue 42 (ADR 0014): a room is a package directly under proxy/ or a flat module there. No two rooms import
    each other, however long the way round (the `layers` contract says which way each may; this says no way
    round exists at all)."""
    graph = grimp.build_graph("proxy")

    def room(m: str) -> str:
        return ".".join(m.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for m in graph.modules:
        for imp in graph.find_modules_directly_imported_by(m):
            if room(m) != room(imp) and imp.startswith("proxy."):
                edges.setdefault(room(m), set()).add(room(imp))
    rooms = sorted(set(edges) | {r for v in edges.values() for r in v})
    loops = [(a, b) for a in rooms for b in edges.get(a, ()) if _reaches(edges, b, a)]
    assert not loops, f"rooms of proxy/ that import each other round a loop: {loops[:5]}"


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False
