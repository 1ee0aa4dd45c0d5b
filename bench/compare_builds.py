#!/usr/bin/env python3
"""compare_builds: one bench program of two builds, alternated in one run.

    bench/compare_builds.py --old OLD_BUILD --new NEW_BUILD [--rounds N] BENCH [ARGS...]

Runs OLD_BUILD/bench/BENCH ARGS and NEW_BUILD/bench/BENCH ARGS in turn, N
rounds (the order flips every round: old new, new old, ...), so that a shared
or warming machine disturbs both alike. Each run's rows are read by the
bench's column header (a line of names separated by two or more spaces; a
new header starts a new section, as bench_cpu_adam's "update" and "grad
stats"), and these columns are compared, one table each:

    bench_offload   "step s"    seconds of one training step (lower is faster)
                    "fb s"      forward + backward alone
    bench_cpu_adam  "Gparam/s"  parameters per second (higher is faster)
                    "%roof"     the same against the memory roof measured just
                                before it in the same run (steadier on a shared
                                machine: the load it sees is the roof's too)
    other benches   --column NAME (repeatable)

A row is one case: its section, its first column and the columns --key names
(default: threads, where the section has it). For every case it prints the
median of the old and the new runs, new/old of the medians, the range of the
per-round ratios, and the old build's own spread (max/min over its rounds: what
noise alone does). The last line is the median over the cases of new/old of
the first column.

Exit: 0 done, 1 a bench failed or printed no comparable rows, 2 bad usage.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

COLUMNS = {"bench_offload": [("step s", "lower"), ("fb s", "lower")],
           "bench_cpu_adam": [("Gparam/s", "higher"), ("%roof", "higher")]}


def number(s):
    try:
        return float(s)
    except ValueError:
        return None


def fields(line):
    return [f for f in re.split(r"\s{2,}", line.strip()) if f]


def parse(text, column, keys):
    """{case: value} of `column` in every section whose header names it."""
    rows, header = {}, None
    for line in text.splitlines():
        if not line.strip() or re.match(r"^[^#].*: [-+0-9.e]+$", line):  # blank, or the result line
            continue
        f = fields(line.lstrip("#"))
        if column in f:  # a header: the section's name is its first column
            header = f
            continue
        if line.startswith("#") or not header or len(f) != len(header):
            continue
        v = number(f[header.index(column)])
        if v is None:
            continue
        case = " / ".join([header[0] + ": " + f[0]] + ["%s %s" % (k, f[header.index(k)]) for k in keys
                                                          if k in header])
        rows[case] = v
    return rows


def run(build, bench, args):
    exe = os.path.join(build, "bench", bench)
    r = subprocess.run([exe] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (exe, r.returncode, (r.stderr or r.stdout).strip()[-300:]))
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--old", required=True, help="the baseline build folder (its bench/BENCH)")
    ap.add_argument("--new", required=True, help="the build measured against it")
    ap.add_argument("--rounds", type=int, default=5, help="runs of each build (default 5)")
    ap.add_argument("--column", action="append", default=None,
                    help="a column compared (repeatable; default: the bench's, above)")
    ap.add_argument("--key", action="append", default=None, help="columns that name a case with the "
                    "first (default: threads)")
    ap.add_argument("bench")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    columns = [(c, "") for c in a.column] if a.column else COLUMNS.get(a.bench, [])
    if not columns:
        ap.error("%s: no default column; name one with --column" % a.bench)
    keys = a.key if a.key is not None else ["threads"]
    for b in (a.old, a.new):
        if not os.access(os.path.join(b, "bench", a.bench), os.X_OK):
            ap.error("%s/bench/%s is not an executable (build it there)" % (b, a.bench))

    outs = {"old": [], "new": []}
    print("# compare_builds: %s %s; old %s, new %s; %d rounds, alternated" % (
        a.bench, " ".join(a.args), a.old, a.new, a.rounds), flush=True)
    try:
        for r in range(a.rounds):
            for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                outs[which].append(run(getattr(a, which), a.bench, a.args))
            print("# round %d of %d done" % (r + 1, a.rounds), file=sys.stderr, flush=True)
    except (RuntimeError, OSError) as e:
        print("compare_builds: %s" % e, file=sys.stderr)
        return 1
    last = None
    for column, better in columns:
        got = {w: [parse(t, column, keys) for t in outs[w]] for w in outs}
        if not all(got["old"] + got["new"]):
            print("compare_builds: a run printed no rows with a column \"%s\"" % column, file=sys.stderr)
            return 1
        print("\n# column \"%s\"%s" % (column, " (%s is faster)" % better if better else ""))
        q = compare(got)
        if q is None:
            print("compare_builds: the two builds print no case in common", file=sys.stderr)
            return 1
        if last is None:
            last = (column, q)
    print("%s \"%s\" new/old, median of %d cases (%d rounds each): %.3f" % (
        a.bench, last[0], len(last[1]), a.rounds, statistics.median(last[1])))
    return 0


def compare(got):
    """Print the table of one column; the per-case ratios (None: no case in common)."""
    cases = [c for c in got["old"][0] if all(c in x for x in got["old"] + got["new"])]
    if not cases:
        return None
    w = max(len(c) for c in cases)
    print("%-*s %12s %12s %9s %17s %11s" % (w, "case", "old", "new", "new/old", "per round", "old spread"))
    ratios = []
    for c in cases:
        old = [x[c] for x in got["old"]]
        new = [x[c] for x in got["new"]]
        per = [n / o for n, o in zip(new, old) if o]
        q = statistics.median(new) / statistics.median(old) if statistics.median(old) else float("nan")
        ratios.append(q)
        spread = max(old) / min(old) if min(old) > 0 else float("nan")
        print("%-*s %12.4g %12.4g %9.3f %8.3f-%-8.3f %11.3f" % (w, c, statistics.median(old),
                                                                statistics.median(new), q, min(per),
                                                                max(per), spread))
    return ratios


if __name__ == "__main__":
    sys.exit(main())
