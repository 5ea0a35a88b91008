#!/usr/bin/env python3
"""Prints the error-registry tables of man/mortarmq.7 (roff + tbl) from the registry in
src/wire/errors.rs, the one place the 51 codes are defined.

Usage: python3 tools/man_errors.py > /tmp/tables.roff, then paste the output between the
ERRORS text and SEE ALSO. tests/cli.rs checks the page against the registry, so a stale
table fails the tests.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REGISTRY = os.path.join(HERE, "../src/wire/errors.rs")
# Usable width of a man page on an 80-column terminal, and tbl's column gaps (2 ens, 4 gaps).
WIDTH, GAPS = 72, 8
NAME_MAX = 22  # longer names get a text block with a break point


# One row of the `registry!` table: `Variant = 0x0001, "NAME", After, Retry, "should";`
ROW = re.compile(r'\w+ = (0x[0-9A-F]{4}), "(\w+)", (\w+), (\w+),\s*"([^"]*)";')


def main():
    text = open(REGISTRY, encoding="utf-8").read()
    body = text[text.index("registry! {"):]
    rows, segs, seg = {}, [], None
    # Segment headings are the comments `// 0x0xxx — protocol / session (26)`.
    for m in re.finditer(r"// (0x\dxxx) — (.*) \(\d+\)|" + ROW.pattern, body):
        if m.group(1):
            seg = (m.group(1), m.group(2))
            segs.append(seg)
            rows[seg] = []
            continue
        code, name, after, retry, should = m.group(3, 4, 5, 6, 7)
        rows[seg].append((code, name, after.lower(), should, retry.lower()))
    out = [".ad l"]
    for seg in segs:
        r = rows[seg]
        out.append(".SS %s \\(em %s (%d)" % (seg[0], seg[1], len(r)))
        namew = min(max(len(x[1]) for x in r), NAME_MAX)
        long_names = any(len(x[1]) > NAME_MAX for x in r)
        shouldw = WIDTH - (6 + namew + 5 + 10 + GAPS)
        namefmt = "lw(%d)2" % namew if long_names else "l2"
        out += [".TS", "lb2 lb2 lb2 lb2 lb", "l2 %s l2 lw(%d)2 l." % (namefmt, shouldw)]
        out.append("Code\tName\tAfter\tClient should\tRetry")
        for code, name, after, should, retry in r:
            if len(name) > NAME_MAX:
                i = name.rfind("_", 0, NAME_MAX) + 1
                name = "T{\n" + name[:i] + "\\:" + name[i:] + "\nT}"
            assert "-" not in should and not should.startswith((".", "'")), should
            out.append("%s\t%s\t%s\tT{\n%s\nT}\t%s" % (code, name, after, should, retry))
        out.append(".TE")
    out.append(".ad")
    print("\n".join(out))


main()
