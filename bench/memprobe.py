"""What pins pymalloc's arenas after a big request (issue 32 point 4): a probe that runs inside `ctproxy up`.

    CTP_MEMPROBE=DIR PYTHONPATH=<repo>:<repo>/bench/memprobe_site ctproxy up …   (bench_soak --mem-probe DIR does it)

Loaded by `bench/memprobe_site/sitecustomize.py` when `CTP_MEMPROBE` names a directory; nothing else of ctproxy
knows it. On SIGUSR2 the process reads the tag from `DIR/cmd` and writes `DIR/<tag>.json`, then `DIR/<tag>.done`:

- RSS, and `sys._debugmallocstats()`'s arena and block totals (captured from fd 2);
- every pymalloc pool, found by scanning the anonymous read-write mappings of /proc/self/maps for 16 KiB-aligned
  pool headers (CPython 3.13, 64-bit: `arenaindex`, `szidx`, `nextoffset`, `maxnextoffset` = 16384 − block size
  is the check), grouped by arena (`arenaindex`); an arena is "new" when its first pool was not there at the tag
  `base`;
- every allocated block of the arenas that are sparse (less than `CTP_MEMPROBE_SPARSE`, default 0.5, of their
  blocks in use): what it is — a Python object (its type read from the block's `ob_type` at offset 0, 16 or 32,
  the GC and managed-dict pre-headers), a dict's keys or values table, a list's item array, a set's table — and
  whether it is reachable from the collector's objects (`gc.get_objects()` with the frozen start-up heap, and their
  referents); for a reachable object, its referrer chain (types and the attribute / key that holds it); for a str,
  its first characters; with `CTP_MEMPROBE_TRACE=N` (tracemalloc started at start-up, N frames), where it was
  allocated;
- with `CTP_MEMPROBE_PEAK=MB` as well (bench_soak passes the environment on), a thread that writes `DIR/peak-K.txt`
  each time the traced memory climbs MB over the last snapshot: the small blocks (pymalloc's) alive then, by where
  they were allocated (what a big request's peak holds in the arenas).

The probe's own allocations come after the pool headers are read, so the counts are the process's, not the
probe's. Reading raw memory is limited to pools whose header passed the check; a wrong guess costs a wrong
row, not a crash.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any

POOL = 1 << 14
POOL_OVERHEAD = 48
ALIGN = 16
MAX_SZIDX = 512 // ALIGN


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def _status_kb() -> dict[str, int]:
    """RssAnon, RssFile, RssShmem (KB) of /proc/self/status."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out


def _anon_vmas() -> list[dict[str, Any]]:
    """The anonymous read-write mappings with their resident KB (/proc/self/smaps), biggest first."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5:
            cur = None
            if parts[1].startswith("rw") and (len(parts) == 5 or parts[5] in ("[heap]", "[stack]")):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                cur = {"lo": lo, "kb": (hi - lo) >> 10, "name": parts[5] if len(parts) > 5 else ""}
                out.append(cur)
        elif cur is not None and parts[0] == "Rss:":
            cur["rss_kb"] = int(parts[1])
    return sorted(out, key=lambda v: -v.get("rss_kb", 0))


def _mallinfo() -> dict[str, int]:
    """glibc's mallinfo2 (bytes): what malloc holds outside pymalloc's arenas; {} without glibc."""
    import ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError, TypeError):
        return {}
    fn.restype = MallInfo2
    info = fn()
    return {n: getattr(info, n) for n in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")}


def mallocstats() -> dict[str, int]:
    """The totals `sys._debugmallocstats()` prints (to fd 2, from C)."""
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("#") and "=" in line:
            k, _, v = line[1:].partition("=")
            v = v.strip().replace(",", "")
            if v.isdigit():
                out[" ".join(k.split())] = int(v)
        elif " bytes in " in line or line.startswith(("Total", "free")):
            k, _, v = line.rpartition(" ")
            v = v.replace(",", "")
            if v.isdigit():
                out[" ".join(k.split())] = int(v)
    return out


def _anon_rw() -> list[tuple[int, int]]:
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[1].startswith("rw") and (len(parts) == 5 or parts[5] == "[heap]"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            spans.append((lo, hi))
    return spans


def scan_pools() -> array:
    """Every 16 KiB-aligned pool header in anonymous rw memory: flat array of (addr, arenaindex, szidx, count,
    nextoffset, freeblock) — made with as few pymalloc allocations as possible (array buffers are malloc'd)."""
    out = array("Q")
    u32 = ctypes.c_uint32 * 4
    u64 = ctypes.c_uint64 * 2
    for lo, hi in _anon_rw():
        addr = (lo + POOL - 1) & ~(POOL - 1)
        while addr + POOL <= hi:
            idx, szidx, nextoffset, maxnext = u32.from_address(addr + 32)
            if szidx < MAX_SZIDX and maxnext == POOL - (szidx + 1) * ALIGN and nextoffset <= POOL \
                    and (nextoffset - POOL_OVERHEAD) % ((szidx + 1) * ALIGN) == 0 and idx < (1 << 24):
                count, freeblock = u64.from_address(addr)
                count &= 0xFFFFFFFF
                if count <= (POOL - POOL_OVERHEAD) // ((szidx + 1) * ALIGN) and \
                        (freeblock == 0 or addr + POOL_OVERHEAD <= freeblock < addr + POOL):
                    out.extend((addr, idx, szidx, count, nextoffset, freeblock))
            addr += POOL
    return out


def _pools(flat: array) -> list[tuple[int, int, int, int, int, int]]:
    return [tuple(flat[i:i + 6]) for i in range(0, len(flat), 6)]  # type: ignore[misc]


def _allocated_blocks(addr: int, szidx: int, nextoffset: int, freeblock: int, snap: bytes) -> array:
    """The allocated blocks of the pool at `addr`, read from `snap` (its 16 KiB, copied at the scan)."""
    size = (szidx + 1) * ALIGN
    free = set()
    p, guard = freeblock, 0
    while p and guard < POOL // ALIGN and addr <= p < addr + POOL - 8:
        free.add(p)
        p = int.from_bytes(snap[p - addr:p - addr + 8], "little")
        guard += 1
    return array("Q", (b for b in range(addr + POOL_OVERHEAD, addr + nextoffset, size) if b not in free))


def _word(snap: bytes, off: int) -> int:
    return int.from_bytes(snap[off:off + 8], "little")


def _all_types() -> dict[int, type]:
    seen: dict[int, type] = {}
    stack = [object, type]
    for o in gc.get_objects():
        if isinstance(o, type):
            stack.append(o)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        try:
            stack.extend(type.__subclasses__(t))
        except TypeError:
            pass
    for mod in list(sys.modules.values()):
        for v in list(getattr(mod, "__dict__", {}).values()):
            if isinstance(v, type) and id(v) not in seen:
                seen[id(v)] = v
                stack.append(v)
    return seen


def _census() -> tuple[dict[int, Any], dict[int, int]]:
    """Every object reachable from the collector's lists (frozen heap included) and their referents:
    id → object; and the extra blocks they own (dict keys/values, list arrays, set tables): address → owner id."""
    roots = gc.get_objects()  # the caller unfroze the start-up heap
    objs: dict[int, Any] = {}
    stack = list(roots)
    del roots
    while stack:
        o = stack.pop()
        i = id(o)
        if i in objs:
            continue
        objs[i] = o
        stack.extend(gc.get_referents(o))
    owned: dict[int, int] = {}
    for i, o in objs.items():
        t = type(o)
        try:
            if t is dict or isinstance(o, dict):
                keys, values = (ctypes.c_uint64 * 2).from_address(i + 32)
                if keys:
                    owned[keys] = i
                if values:
                    owned[values] = i
                    owned[values - 8] = i  # 3.13: the values array has a prefix before the pointer
            elif t is list or isinstance(o, list):
                item = ctypes.c_uint64.from_address(i + 24).value
                if item:
                    owned[item] = i
            elif t in (set, frozenset):
                table = ctypes.c_uint64.from_address(i + 40).value
                if table and table != i + 56:
                    owned[table] = i
        except (ValueError, OverflowError):
            pass
    return objs, owned


def _label(o: Any) -> str:
    t = type(o)
    name = f"{t.__module__}.{t.__qualname__}" if t.__module__ not in ("builtins", None) else t.__qualname__
    if isinstance(o, str):
        return f"{name} {o[:40]!r}"
    if isinstance(o, (bytes, bytearray)):
        return f"{name} {bytes(o[:24])!r}"
    if isinstance(o, (int, float)):
        return f"{name} {o!r}"[:60]
    if isinstance(o, type):
        return f"type {o.__module__}.{o.__qualname__}"
    if callable(o) and hasattr(o, "__qualname__"):
        return f"{name} {getattr(o, '__module__', '')}.{o.__qualname__}"
    if t.__name__ == "module":
        return f"module {o.__name__}"
    return name


def _how_held(parent: Any, child: Any) -> str:
    try:
        if isinstance(parent, dict):
            for k, v in parent.items():
                if v is child:
                    return f"[{k!r}]"[:60]
                if k is child:
                    return "(key)"
        elif isinstance(parent, (list, tuple)):
            for n, v in enumerate(parent):
                if v is child:
                    return f"[{n}]"
    except Exception:
        pass
    return ""


def _chain(o: Any, objs: dict[int, Any], depth: int = 6) -> list[str]:
    """Who holds `o`: up to `depth` referrers, each the first one that is not the probe's own bookkeeping."""
    out = []
    skip = {id(objs), id(sys._getframe())}
    cur = o
    for _ in range(depth):
        refs = [r for r in gc.get_referrers(cur) if id(r) not in skip and not isinstance(r, type(sys._getframe()))]
        if not refs:
            out.append("(no referrer the collector sees)")
            break
        r = refs[0]
        out.append(f"{_label(r)}{_how_held(r, cur)}" + (f" (+{len(refs) - 1} more)" if len(refs) > 1 else ""))
        if isinstance(r, type(sys)) or (isinstance(r, dict) and r.get("__name__") in sys.modules
                                        and isinstance(r.get("__builtins__"), (dict, type(sys)))):
            break
        skip.add(id(refs))
        cur = r
    return out


def _raw_str(snap: bytes, off: int) -> str:
    """The first characters of a compact ASCII str at `off` of a pool snapshot (3.13: data after 40 bytes)."""
    length = _word(snap, off + 16)
    state = int.from_bytes(snap[off + 32:off + 36], "little")
    if 0 <= length < 1 << 30 and state & (1 << 5) and state & (1 << 6):  # compact, ascii
        return snap[off + 40:off + 40 + min(length, 40)].decode("ascii", "replace")
    return "?"


def report(tag: str, base: dict[str, Any] | None) -> dict[str, Any]:
    rss = _rss_kb()
    # Before the probe allocates anything much: the pool headers, and a copy of the sparse arenas' used pools (bytes
    # of 16 KiB are malloc'd, not pymalloc's; sums in arrays, not ints in dicts). What the probe allocates after
    # this may take those pools' free blocks, and must not be counted as theirs.
    flat = scan_pools()
    sparse_at = float(os.environ.get("CTP_MEMPROBE_SPARSE", "0.5"))
    capacity = (1 << 20) - POOL  # bytes of an arena's pools, about
    top = max(flat[1::6], default=0) + 1
    used = array("Q", bytes(8 * top))
    for k in range(0, len(flat), 6):
        used[flat[k + 1]] += flat[k + 3] * (flat[k + 2] + 1) * ALIGN
    if os.environ.get("CTP_MEMPROBE_NEW") and base is not None:  # every arena made since `base`, whatever its fill
        first = array("Q", [1 << 63]) * top
        for k in range(0, len(flat), 6):
            first[flat[k + 1]] = min(first[flat[k + 1]], flat[k])
        old = set(base["arena_first_pools"])
        sparse_at, used = 2.0, array("Q", (0 if first[i] not in old else 1 << 40 for i in range(top)))
    snap_at = array("Q", (k for k in range(0, len(flat), 6)
                          if flat[k + 3] and used[flat[k + 1]] < sparse_at * capacity))
    snaps_raw = [ctypes.string_at(flat[k], POOL) for k in snap_at]
    stats = mallocstats()
    status, mallinfo, vmas = _status_kb(), _mallinfo(), _anon_vmas()
    pools = _pools(flat)
    for v in vmas:  # how many pymalloc pools each mapping holds
        v["pools"] = sum(1 for p in pools if v["lo"] <= p[0] < v["lo"] + (v["kb"] << 10))
    arenas: dict[int, dict[str, Any]] = {}
    for addr, idx, szidx, count, _nextoffset, _freeblock in pools:
        a = arenas.setdefault(idx, {"first_pool": addr, "pools": 0, "used_pools": 0, "blocks": 0, "bytes": 0})
        a["first_pool"] = min(a["first_pool"], addr)
        a["pools"] += 1
        if count:
            a["used_pools"] += 1
            a["blocks"] += count
            a["bytes"] += count * (szidx + 1) * ALIGN
    out: dict[str, Any] = {"tag": tag, "pid": os.getpid(), "rss_kb": rss, "status_kb": status,
                           "mallinfo2": mallinfo, "anon_mappings": vmas[:40], "mallocstats": stats,
                           "arenas_seen": len(arenas), "pools_seen": len(pools),
                           "used_bytes": sum(a["bytes"] for a in arenas.values()),
                           "arena_first_pools": sorted(a["first_pool"] for a in arenas.values())}
    base_firsts = set(base["arena_first_pools"]) if base else set()
    sparse = {flat[k + 1] for k in snap_at}
    out["arenas"] = [{"index": i, **a, "new": base is not None and a["first_pool"] not in base_firsts,
                      "fill": round(a["bytes"] / capacity, 3)} for i, a in sorted(arenas.items())]
    if tag == "base" or not sparse:
        return out
    snaps = [(tuple(flat[k:k + 6]), raw) for k, raw in zip(snap_at, snaps_raw, strict=True)]
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # the frozen start-up heap in the collector's lists (census, referrers); frozen again after
    try:
        _explain(out, snaps, sparse)
    finally:
        if frozen:
            gc.freeze()
    return out


def _explain(out: dict[str, Any], snaps: list[tuple[tuple[int, ...], bytes]], sparse: set[int]) -> None:
    blocks: list[tuple[int, int, int, bytes, int]] = []  # (block, size, arena, pool snapshot, pool address)
    for (addr, idx, szidx, _count, nextoffset, freeblock), snap in snaps:
        blocks += [(b, (szidx + 1) * ALIGN, idx, snap, addr)
                   for b in _allocated_blocks(addr, szidx, nextoffset, freeblock, snap)]
    types = _all_types()
    objs, owned = _census()
    tracing = __import__("tracemalloc").is_tracing()
    list_at = int(os.environ.get("CTP_MEMPROBE_LIST", "60"))  # every block of an arena with at most this many
    small_arena: collections.Counter[int] = collections.Counter(idx for _b, _s, idx, _snap, _p in blocks)
    listed: list[dict[str, Any]] = []
    by_kind: collections.Counter[tuple[str, str]] = collections.Counter()
    bytes_by_kind: collections.Counter[tuple[str, str]] = collections.Counter()
    per_arena: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    examples: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for b, size, idx, snap, pool in blocks:
        kind, what, obj, addr, tp = "raw", "(not an object the probe knows)", None, None, 0
        for off in (0, 16, 32):
            if off + 16 > size:
                break
            tp = _word(snap, b - pool + off + 8)
            if tp in types and 0 <= _word(snap, b - pool + off) < 1 << 62:
                addr = b + off
                break
        if addr is not None and addr in objs and id(type(objs[addr])) == tp:
            obj = objs[addr]
            kind, what = "reachable", _label(obj)
        elif addr is not None:
            t = types[tp]
            kind = "unreachable object" if _word(snap, addr - pool) else "free-listed object (refcount 0)"
            what = f"{t.__module__}.{t.__qualname__}"
            if t is str:
                what += f" {_raw_str(snap, addr - pool)!r}"
        elif b in owned or b + 8 in owned:
            owner = objs[owned.get(b) or owned[b + 8]]
            kind, what, obj = "owned table", f"table of {_label(owner)}", owner
        key = (kind, what if kind != "reachable" else what.split(" ")[0])
        if kind == "raw":
            key = (kind, f"{what} size {size}")
        by_kind[key] += 1
        bytes_by_kind[key] += size
        per_arena[idx][kind] += 1
        if small_arena[idx] <= list_at:
            row: dict[str, Any] = {"arena": idx, "size": size, "kind": kind, "what": what}
            if obj is not None:
                row["held_by"] = _chain(obj, objs, 5)
                if tracing:
                    tb = __import__("tracemalloc").get_object_traceback(obj)
                    row["allocated_at"] = [str(f) for f in tb] if tb else None
            elif kind == "raw":
                row["words"] = [hex(_word(snap, b - pool + 8 * w)) for w in range(min(size // 8, 6))]
            listed.append(row)
        if len(examples[key]) < 3:
            ex: dict[str, Any] = {"block": hex(b), "size": size, "what": what, "arena": idx,
                                  "words": [hex(_word(snap, b - pool + 8 * w)) for w in range(min(size // 8, 6))]}
            if obj is not None and not examples[key]:
                ex["held_by"] = _chain(obj, objs)
                if tracing:
                    tb = __import__("tracemalloc").get_object_traceback(obj)
                    ex["allocated_at"] = [str(f) for f in tb] if tb else None
            examples[key].append(ex)
    out["sparse_arenas"] = len(sparse)
    out["sparse_blocks"] = len(blocks)
    out["sparse_by_kind"] = [{"kind": k, "what": w, "blocks": n, "bytes": bytes_by_kind[(k, w)],
                              "examples": examples[(k, w)]} for (k, w), n in by_kind.most_common(80)]
    out["sparse_per_arena"] = {str(i): dict(c) for i, c in sorted(per_arena.items())}
    out["blocks_of_nearly_empty_arenas"] = listed


_last: dict[str, dict[str, Any]] = {}


def _run(d: Path) -> None:
    tag = (d / "cmd").read_text().strip() or "report"
    t0 = time.monotonic()
    try:
        res = report(tag, _last.get("base"))
    except Exception as exc:  # a probe that fails says so
        res = {"tag": tag, "error": repr(exc)}
    res["probe_s"] = round(time.monotonic() - t0, 2)
    if tag == "base":
        _last["base"] = res
    (d / f"{tag}.json").write_text(json.dumps(res, indent=1, default=str))
    (d / f"{tag}.done").write_text("")


def _watch_peaks(d: Path, step_mb: float) -> None:
    """`CTP_MEMPROBE_PEAK=MB` (with `CTP_MEMPROBE_TRACE`): each time the traced memory climbs `MB` over the last
    snapshot's level, write `DIR/peak-K.txt`: the small blocks (pymalloc's, ≤ 512 bytes) alive then, by where they
    were allocated, biggest first — what a big request's peak holds in pymalloc's arenas."""
    import tracemalloc

    level, k = tracemalloc.get_traced_memory()[0] + step_mb * 1e6, 0
    while True:
        time.sleep(0.02)
        now = tracemalloc.get_traced_memory()[0]
        if now < level:
            continue
        snap = tracemalloc.take_snapshot()
        small, big = collections.Counter(), collections.Counter()
        count = collections.Counter()
        for tr in snap.traces._traces:
            if tr[1] <= 512:
                small[tr[2]] += tr[1]
                count[tr[2]] += 1
            else:
                big[tr[2]] += tr[1]
        lines = [f"traced {now / 1e6:.1f} MB; small blocks {sum(small.values()) / 1e6:.1f} MB"]
        for tb, size in small.most_common(25):
            frames = " < ".join(f"{f[0].rsplit('/', 2)[-1]}:{f[1]}" for f in tb)
            lines.append(f"{size / 1e6:8.2f} MB {count[tb]:8d}  {frames}")
        lines.append(f"bigger blocks (malloc's) {sum(big.values()) / 1e6:.1f} MB:")
        for tb, size in big.most_common(15):
            frames = " < ".join(f"{f[0].rsplit('/', 2)[-1]}:{f[1]}" for f in tb)
            lines.append(f"{size / 1e6:8.2f} MB  {frames}")
        (d / f"peak-{k}.txt").write_text("\n".join(lines) + "\n")
        k += 1
        level = tracemalloc.get_traced_memory()[0] + step_mb * 1e6


def install() -> None:
    d = os.environ.get("CTP_MEMPROBE")
    if not d or threading.current_thread() is not threading.main_thread():
        return
    if frames := int(os.environ.get("CTP_MEMPROBE_TRACE", "0") or 0):
        __import__("tracemalloc").start(frames)
        if step := float(os.environ.get("CTP_MEMPROBE_PEAK", "0") or 0):
            threading.Thread(target=_watch_peaks, args=(Path(d), step), daemon=True, name="memprobe-peaks").start()
    signal.signal(signal.SIGUSR2, lambda *_: _run(Path(d)))
