#!/usr/bin/env python3
"""Converts a Markdown page written as a man page (docs/cli.md: "# name(N)",
"## SECTION", "### subsection", paragraphs, ``` blocks, "- " lists,
"####" headings, "term" + ": definition" lists, numbered lists, tables,
"> " quotes, `code`, **bold**, [text](link)) into scdoc, so the man page is
generated from the one document instead of being kept twice.
Usage: md2scd.py IN.md OUT.scd"""
import re
import sys


def esc(text):
    # scdoc formatting characters and the backslash itself.
    return re.sub(r'([\\*_])', r'\\\1', text)


def inline(text):
    out = []
    # Split into `code` spans and the rest.
    for i, part in enumerate(re.split(r'(`[^`]*`)', text)):
        if i % 2 == 1:
            out.append('*' + esc(part[1:-1]) + '*')
            continue
        part = re.sub(r'\[([^\]]*)\]\(([^)]*)\)', r'\1 (\2)', part)
        pieces = re.split(r'(\*\*[^*]+\*\*)', part)
        for j, p in enumerate(pieces):
            out.append('*' + esc(p[2:-2]) + '*' if j % 2 == 1 else esc(p))
    return ''.join(out)


def convert(lines, path):
    out = []
    i = 0
    n = len(lines)
    if not lines or not re.match(r'^# \S+\(\d\)$', lines[0]):
        sys.exit(f'{path}:1: expected "# name(section)"')
    out.append(lines[0][2:])
    i = 1
    while i < n:
        line = lines[i]
        where = f'{path}:{i + 1}'
        if line.startswith('```'):
            out.append('```')
            i += 1
            while i < n and not lines[i].startswith('```'):
                out.append(lines[i])
                i += 1
            if i == n:
                sys.exit(f'{where}: unterminated code block')
            out.append('```')
            i += 1
        elif re.match(r'^#{3,6} ', line):
            out.append('## ' + inline(line.split(' ', 1)[1]))
            i += 1
        elif line.startswith('## '):
            out.append('# ' + inline(line[3:]))
            i += 1
        elif line.startswith('|'):
            # A table: header row, the |---| rule, rows; scdoc's boxed table.
            rows = []
            while i < n and lines[i].startswith('|'):
                cells = [c.strip() for c in lines[i].strip().strip('|').split('|')]
                if not all(re.match(r'^:?-+:?$', c) for c in cells):
                    rows.append(cells)
                i += 1
            if out and out[-1] != '':
                out.append('')
            for r, cells in enumerate(rows):
                for c, cell in enumerate(cells):
                    text = inline(cell) or '-'
                    if r == 0:
                        text = '*' + text + '*' if not text.startswith('*') else text
                        out.append(('[[ ' if c == 0 else ':[ ') + text)
                    else:
                        out.append(('|  ' if c == 0 else ':  ') + text)
            if i < n and lines[i].strip():
                out.append('')
        elif re.match(r'^\d+\. ', line):
            out.append('. ' + inline(line.split(' ', 1)[1]))
            i += 1
            while i < n and lines[i].startswith('   ') and lines[i].strip():
                out.append('  ' + inline(lines[i].strip()))
                i += 1
        elif line.startswith('> '):
            out.append('\t' + inline(line[2:]))
            i += 1
        elif line.startswith('- '):
            out.append('- ' + inline(line[2:]))
            i += 1
            while i < n and lines[i].startswith('  ') and lines[i].strip():
                out.append('  ' + inline(lines[i].strip()))
                i += 1
        elif line.strip() and i + 1 < n and lines[i + 1].startswith(': '):
            # A definition: the term, then its text indented.
            out.append(inline(line))
            i += 1
            out.append('\t' + inline(lines[i][2:]))
            i += 1
            while i < n and lines[i].startswith('  ') and lines[i].strip():
                out.append('\t' + inline(lines[i].strip()))
                i += 1
        else:
            out.append(inline(line))
            i += 1
    return out


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding='utf-8') as f:
        lines = f.read().splitlines()
    out = convert(lines, src)
    with open(dst, 'w', encoding='utf-8') as f:
        f.write('\n'.join(out) + '\n')


if __name__ == '__main__':
    main()
