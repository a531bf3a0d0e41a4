#!/usr/bin/python3
"""Plots bench_datapath's samples (its json file): the ratio of medians against
size, for transfers (dspk against the raw Unix socket and memcpy) and for
gemm f32 (dspk, operands inline and resident, against cblas_sgemm in-process).

    plot.py samples.json OUTDIR      writes OUTDIR/perf-transfers.png, OUTDIR/perf-gemm.png
"""
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def med(s, k):
    return statistics.median(s[k]) if s.get(k) else None


def ratio(s, dspk, ref):
    a, b = med(s, dspk), med(s, ref)
    return b / a if a and b else None


def series(s, sizes, dspk, ref):
    pts = [(n, ratio(s, dspk % n, ref % n)) for n in sizes]
    return [p[0] for p in pts if p[1]], [p[1] for p in pts if p[1]]


def main():
    s = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    xs = [1, 4, 16, 64, 256]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=80)
    for dspk, ref, label in [("write.dspk.%d", "write.raw.%d", "buffer_write / raw socket"),
                             ("read.dspk.%d", "read.raw.%d", "buffer_read / raw socket"),
                             ("read.dspk.%d", "memcpy.%d", "buffer_read / memcpy")]:
        x, y = series(s, xs, dspk, ref)
        ax.plot(x, y, marker="o", label=label)
    ax.axhline(0.8, color="grey", linestyle="--", linewidth=1, label="goal 0.8")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(v) for v in xs])
    ax.set_xlabel("MiB per call")
    ax.set_ylabel("bandwidth ratio (dspk / floor)")
    ax.set_title("dspk transfers on cpu:0 (median of rounds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out + "/perf-transfers.png")

    gs = [256, 512, 1024, 2048]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=80)
    for dspk, label in [("gemm.inline.%d", "operands inline (client memory)"),
                        ("gemm.resident.%d", "operands in daemon buffers")]:
        x, y = series(s, gs, dspk, "gemm.inproc.%d")
        ax.plot(x, y, marker="o", label=label)
    ax.axhline(0.95, color="grey", linestyle="--", linewidth=1, label="goal 0.95 (2048, inline)")
    ax.axhline(0.9, color="grey", linestyle=":", linewidth=1, label="goal 0.9 (256, resident)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gs, [str(v) for v in gs])
    ax.set_xlabel("N (gemm N x N x N, f32)")
    ax.set_ylabel("speed ratio (in-process time / dspk time)")
    ax.set_title("dspk gemm on cpu:0 vs cblas_sgemm in-process")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out + "/perf-gemm.png")


if __name__ == "__main__":
    main()
