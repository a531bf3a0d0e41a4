#!/usr/bin/env python3
"""install.docs: dspk-submit(1), generated from docs/cli.md by md2scd.py,
renders what cli.md says: every line of its ``` examples as written (a
trailing shell continuation backslash included), no Markdown backtick left
over (a `code` span crossing a line break), and no running-text line lost
or cut at its start (a line beginning with "..." or "-" that roff or scdoc
would read as a request or a list entry).
Usage: man_render.py CLI.md RENDERED.txt (man -l at a wide MANWIDTH)"""
import re
import sys


def norm(s):
    return re.sub(r'\s+', ' ', s).strip()


def main():
    md = open(sys.argv[1], encoding='utf-8').read().splitlines()
    page = open(sys.argv[2], encoding='utf-8').read()
    flat = norm(page)
    bad = []
    if '`' in page:
        for ln in page.splitlines():
            if '`' in ln:
                bad.append('a backtick in the page: %r' % ln.strip())
    code = False
    for i, ln in enumerate(md, 1):
        if ln.startswith('```'):
            code = not code
            continue
        t = norm(ln)
        if code:
            if t and t not in flat:
                bad.append('cli.md:%d: example line not in the page: %r' % (i, t))
        elif re.match(r'^\s*(\.|-[^ ])', ln):
            # running text starting with a dot or a dash: its plain words
            words = norm(re.sub(r'[`*]', '', ln))
            if words not in flat:
                bad.append('cli.md:%d: line not in the page as written: %r' % (i, words))
    for b in bad:
        print('FAIL: dspk-submit(1): ' + b, file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
