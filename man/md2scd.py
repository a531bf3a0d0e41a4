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


def bold(text):
    # scdoc's bold around the text, the spaces at its ends left outside.
    core = text.strip()
    if not core:
        return text
    lead = text[:len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()):]
    return lead + '*' + esc(core) + '*' + trail


def inline(text, st=None):
    """text, one line, in scdoc.  st carries whether a `code` span is open
    from the line before (Markdown lets a span cross a line break; scdoc's
    bold does not): a span open at the end of the line is closed there and
    reopened on the next."""
    if st is None:
        st = {'code': False}
    out = []
    for k, seg in enumerate(text.split('`')):
        if k > 0:
            st['code'] = not st['code']
        if st['code']:
            out.append(bold(seg))
            continue
        seg = re.sub(r'\[([^\]]*)\]\(([^)]*)\)', r'\1 (\2)', seg)
        pieces = re.split(r'(\*\*[^*]+\*\*)', seg)
        for j, p in enumerate(pieces):
            out.append(bold(p[2:-2]) if j % 2 == 1 else esc(p))
    return ''.join(out)


def code_line(line):
    # A line of a ``` block: scdoc reads a backslash there as an escape
    # (a trailing one, a shell continuation, vanished), so it is doubled.
    return line.replace('\\', '\\\\')


def starts_badly(text):
    # A line scdoc or roff would read as something else at its start: "."
    # or "'" (a roff request: "... in argument order" lost a dot), "-" (a
    # list entry).  Such a line is joined to the line before it.
    t = text.lstrip('\t ')
    return t[:1] in ('.', "'", '-')


def add(out, text):
    """Appends a line of running text, joined to the previous line when it
    would start badly (the previous line is text of the same block)."""
    if starts_badly(text) and out and out[-1].strip() and not out[-1].startswith(('#', '```')):
        out[-1] += ' ' + text.lstrip('\t ')
    else:
        out.append(text)


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
                out.append(code_line(lines[i]))
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
            st = {'code': False}
            out.append('. ' + inline(line.split(' ', 1)[1], st))
            i += 1
            while i < n and lines[i].startswith('   ') and lines[i].strip():
                add(out, '  ' + inline(lines[i].strip(), st))
                i += 1
        elif line.startswith('> '):
            out.append('\t' + inline(line[2:]))
            i += 1
        elif line.startswith('- '):
            st = {'code': False}
            out.append('- ' + inline(line[2:], st))
            i += 1
            while i < n and lines[i].startswith('  ') and lines[i].strip():
                add(out, '  ' + inline(lines[i].strip(), st))
                i += 1
        elif line.strip() and i + 1 < n and lines[i + 1].startswith(': '):
            # A definition: the term, then its text indented.
            out.append(inline(line))
            i += 1
            st = {'code': False}
            out.append('\t' + inline(lines[i][2:], st))
            i += 1
            while i < n and lines[i].startswith('  ') and lines[i].strip():
                add(out, '\t' + inline(lines[i].strip(), st))
                i += 1
        elif line.strip():
            # A paragraph: its lines up to a blank line or another block.
            st = {'code': False}
            out.append(inline(line, st))
            i += 1
            while (i < n and lines[i].strip() and not re.match(
                    r'^(```|#|\||\d+\. |> |- )', lines[i])
                   and not (i + 1 < n and lines[i + 1].startswith(': '))):
                add(out, inline(lines[i], st))
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
