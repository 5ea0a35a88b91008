#!/usr/bin/env python3
"""Lists Rust functions longer than a limit (tools/tidy.sh runs it over src/).

A function runs from its `fn` line to the closing brace at the same indentation (the
code is rustfmt-formatted). Test code is exempt: files named tests.rs, and a module
opened by `#[cfg(test)]` to the end of its file.

Usage: fn_length.py LIMIT DIR...   (prints one line per long function; exit 1 if any)
"""
import os
import re
import sys

FN = re.compile(
    r'^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?'
    r'fn\s+(\w+)'
)
TEST_MODULE = re.compile(r'\s*(pub\s+)?mod\s+\w+\s*\{')


def code_end(lines):
    """Index of the first line of the file's test module, or the number of lines."""
    for i, line in enumerate(lines[:-1]):
        if line.strip() == '#[cfg(test)]' and TEST_MODULE.match(lines[i + 1]):
            return i
    return len(lines)


def long_functions(path, limit):
    lines = open(path, encoding='utf-8').read().split('\n')
    end = code_end(lines)
    for i in range(end):
        m = FN.match(lines[i])
        if not m or lines[i].rstrip().endswith(';'):
            continue
        indent, name = m.group(1), m.group(8)
        j = i
        while j < end and lines[j] != indent + '}' and not (j == i and lines[j].rstrip().endswith('}')):
            j += 1
        if j - i + 1 > limit:
            yield i + 1, name, j - i + 1


def main():
    limit, roots = int(sys.argv[1]), sys.argv[2:]
    found = False
    for root in roots:
        for dirpath, _, files in sorted(os.walk(root)):
            for f in sorted(files):
                if f.endswith('.rs') and f != 'tests.rs':
                    path = os.path.join(dirpath, f)
                    for line, name, n in long_functions(path, limit):
                        print(f'{path}:{line}: fn {name} is {n} lines (limit {limit})')
                        found = True
    sys.exit(1 if found else 0)


if __name__ == '__main__':
    main()
