#!/usr/bin/env python3
"""structure: the picture of offload/ as layers, checked against the docs.

    scripts/structure.py [--root DIR] [--max-back N]

Reads the layer order from docs/architecture.md (the first code block under
"## The runtime: layers and a step's data path": every line naming .c files
is a layer, the first line the top one; files on one line are peers) and the
sources of offload/, and prints:

  - the layers, top first;
  - the arrows: file A -> file B when A names a function B defines (not
    static: a call, or the function passed as a value) or includes B's
    header (X.h belongs to X.c; offload.h, the public header of types every
    layer speaks, belongs to none);
  - the cycles (strongly connected groups of more than one file);
  - the arrows running back up: from a lower layer into a higher one;
  - the fields of `struct offload`;
  - the lines of grads.c, optim.c and stream.c that ask where a block lives
    (name the device share, `dev_block` or `dev_shard`, or the activation
    checkpoints' placement, `bnd` / `bnd_host`).

Exit: 0 when there is no cycle, every file has its layer in the docs and at
most --max-back arrows run back up (default: any number); 1 otherwise; 2 bad
usage. Python's standard library only.
"""
import argparse
import os
import re
import sys

SECTION = "## The runtime: layers and a step's data path"
WHERE_FILES = ("grads.c", "optim.c", "stream.c")
WHERE_RE = re.compile(r"\b(dev_block|dev_shard|bnd|bnd_host)\b")


def strip(text):
    """C source without comments and string/char literals (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def definitions(code):
    """Names of the functions defined at file scope that are not static."""
    names, depth, start = [], 0, 0
    for m in re.finditer(r"[{};]|\b([A-Za-z_]\w*)\s*\(", code):
        tok = m.group(0)
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if depth == 0:
                start = m.end()
        elif tok == ";":
            if depth == 0:
                start = m.end()
        elif depth == 0:
            # name( ... ) { : a definition; the text since the last
            # declaration says whether it is static
            k, level = m.end(), 1
            while k < len(code) and level:
                level += {"(": 1, ")": -1}.get(code[k], 0)
                k += 1
            rest = code[k:k + 200].lstrip()
            decl = code[start:m.start()]
            if rest.startswith("{") and not re.search(r"\bstatic\b", decl) and not decl.strip().startswith("#"):
                names.append(m.group(1))
    return names


def includes(code_raw):
    return re.findall(r'^\s*#\s*include\s+"offload/([\w.]+)"', code_raw, re.M)


def doc_layers(doc_path):
    """[[file, ...], ...] top first, from the docs' diagram."""
    with open(doc_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        i = next(k for k, l in enumerate(lines) if l.strip() == SECTION)
    except StopIteration:
        return None
    while i < len(lines) and not lines[i].startswith("    "):
        i += 1
    layers, seen = [], set()
    while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
        names = [n for n in re.findall(r"\b([a-z_]\w*\.c)\b", lines[i]) if n not in seen]
        if names:
            layers.append(names)
            seen.update(names)
        i += 1
    return layers


def sccs(nodes, edges):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def struct_fields(codes):
    """Declarators of `struct offload { ... }`, or None when not found."""
    for code in codes.values():
        m = re.search(r"\bstruct\s+offload\s*\{", code)
        if not m:
            continue
        depth, k, body = 1, m.end(), []
        while depth:
            depth += {"{": 1, "}": -1}.get(code[k], 0)
            body.append(code[k] if depth == 1 else " ")
            k += 1
        count = 0
        for decl in "".join(body).split(";"):
            decl = decl.strip()
            if decl:  # a, b, *c: three fields (commas inside brackets are none here)
                count += decl.count(",") + 1
        return count
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--max-back", type=int, default=None, help="fail above this many arrows back up")
    a = ap.parse_args()
    src = os.path.join(a.root, "offload")
    files = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
    raw = {f: open(os.path.join(src, f), encoding="utf-8").read() for f in files}
    code = {f: strip(t) for f, t in raw.items()}
    cfiles = [f for f in files if f.endswith(".c")]
    owner = {}  # function -> file defining it
    for f in cfiles:
        for name in definitions(code[f]):
            owner[name] = f

    def header_owner(h):
        c = h[:-2] + ".c"
        return c if h != "offload.h" and c in cfiles else None

    edges = {f: {} for f in cfiles}  # a -> {b: [why]}

    def add(a, b, why):
        if b and a != b:
            edges[a].setdefault(b, [])
            if why not in edges[a][b]:
                edges[a][b].append(why)

    for f in files:
        me = f if f.endswith(".c") else header_owner(f)
        if not me:
            continue
        for h in includes(raw[f]):
            add(me, header_owner(h), "#include " + h)
        if f.endswith(".c"):
            for name in sorted(set(re.findall(r"\b[A-Za-z_]\w*\b", code[f]))):
                if name in owner:
                    add(f, owner[name], name)

    layers = doc_layers(os.path.join(a.root, "docs", "architecture.md"))
    if layers is None:
        print("docs/architecture.md: no section \"%s\"" % SECTION[3:])
        return 1
    level = {f: i for i, names in enumerate(layers) for f in names}
    ok = True
    print("offload/ as layers (docs/architecture.md, \"%s\"), top first:" % SECTION[3:])
    for i, names in enumerate(layers):  # numbered from the bottom, as the table is
        print("  %2d  %s" % (len(layers) - i, "  ".join(names)))
    unplaced = [f for f in cfiles if f not in level]
    ghosts = [f for f in level if f not in cfiles]
    if unplaced:
        print("  not in the docs' layers: %s" % ", ".join(unplaced))
        ok = False
    if ghosts:
        print("  in the docs' layers, not in offload/: %s" % ", ".join(ghosts))
        ok = False

    n_arrows = sum(len(v) for v in edges.values())
    print("\narrows (%d): A -> B, what A uses of B" % n_arrows)
    back = []
    for f in sorted(cfiles, key=lambda f: (level.get(f, 99), f)):
        for b in sorted(edges[f], key=lambda b: (level.get(b, 99), b)):
            up = f in level and b in level and level[b] < level[f]
            if up:
                back.append((f, b))
            why = edges[f][b]
            shown = ", ".join(why[:4]) + (", ... (%d)" % len(why) if len(why) > 4 else "")
            print("  %-10s -> %-10s %s%s" % (f, b, "[BACK UP] " if up else "", shown))

    cycles = [c for c in sccs(cfiles, edges) if len(c) > 1]
    print("\ncycles: %d" % len(cycles))
    for c in cycles:
        print("  " + " / ".join(c))
    print("arrows running back up: %d" % len(back))
    for f, b in back:
        print("  %s -> %s" % (f, b))
    fields = struct_fields(code)
    print("struct offload: %s fields" % ("?" if fields is None else fields))
    total = 0
    for f in WHERE_FILES:
        hits = [k + 1 for k, l in enumerate(code.get(f, "").splitlines()) if WHERE_RE.search(l)]
        total += len(hits)
        where = " (lines %s)" % ", ".join(map(str, hits)) if hits else ""
        print("%s: %d lines ask where a block lives%s" % (f, len(hits), where))
    if cycles:
        ok = False
    if a.max_back is not None and len(back) > a.max_back:
        print("more than %d arrows run back up" % a.max_back)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
