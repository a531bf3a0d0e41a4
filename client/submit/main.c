/*
 * dspk-submit: the command-line client of dspkd.
 *
 * This file holds the entry point: global options (--socket, --help,
 * --version), the table of commands with their --help texts, and the
 * helpers every command uses to report errors, parse numbers and connect.
 * Commands themselves live in info.c (ping, devices, status), ops.c
 * (gemm, fft, fir, contract, reduce, map), kernel.c (kernel) and cache.c
 * (cache stats, cache clear).  The rule for output: results on
 * stdout, and on failure exactly one line on stderr of the form
 * "dspk-submit: COMMAND: ENAME: detail" and a non-zero exit status (1 when
 * the operation failed, 2 for a bad command line).
 */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/submit/submit.h"
#include "proto/sockpath.h"
#include "proto/units.h"

#define PROG "dspk-submit"

/* Shared by the --help of the compute commands. */
#define INPUTS_HELP                                                            \
  "\n"                                                                         \
  "An input is a .npy file, - for a .npy on standard input, FILE.npz:NAME\n"   \
  "for the array NAME of a numpy .npz archive (FILE.npz alone: its only\n"     \
  "array).  -o FILE replaces FILE only once the result is written whole\n"   \
  "(through a temporary beside it; a failed write leaves it as it was).\n"    \
  "-o - writes the result .npy to standard output; the summary\n"             \
  "then goes to standard error.  The summary (or the JSON: device, time_us,\n" \
  "outputs with dtype, shape, count and the first values or the file, \"-\"\n" \
  "for -o -) says where the task ran and the daemon's time for it.\n"

const dspk__sub_cmd dspk__sub_cmds[] = {
    {"ping", dspk__sub_ping, "round trip to the daemon, with timing",
     "usage: dspk-submit ping [-c COUNT] [-s SIZE] [--json]\n"
     "\n"
     "Sends ping requests to the daemon and times each round trip.\n"
     "Without -c: one round trip, prints its time.\n"
     "\n"
     "  -c, --count COUNT   COUNT round trips (1..1000000); prints min, median\n"
     "                      and 99th percentile in microseconds\n"
     "  -s, --size SIZE     payload bytes echoed by the daemon (default 0, at\n"
     "                      most 64M; units K, M, G, T or KiB, MiB...: 2K = 2048)\n"
     "      --json          print {\"count\":..,\"min_us\":..,\"median_us\":..,\n"
     "                      \"p99_us\":..} instead of text\n"},
    {"devices", dspk__sub_devices, "list the daemon's compute devices",
     "usage: dspk-submit devices [--all] [--json]\n"
     "\n"
     "Lists the devices the daemon can run tasks on: id (what --device\n"
     "takes, e.g. cpu:0, cuda:1), type, memory and name.\n"
     "\n"
     "  -a, --all    also list the backends that are not available, and why\n"
     "      --json   print the daemon's answer as JSON\n"},
    {"status", dspk__sub_status, "daemon, client and queue status",
     "usage: dspk-submit status [--json]\n"
     "\n"
     "Shows the daemon (version, pid, uptime, socket), its connected clients\n"
     "(id, pid, uid, gid, tasks in flight, buffers, client name; only your own\n"
     "unless you are an admin of the daemon) and per-device counters (queued,\n"
     "running, completed, failed).\n"
     "\n"
     "  --json   print the daemon's answer as JSON (includes backend stats)\n"},
    {"gemm", dspk__sub_gemm, "C = alpha*op(A)@op(B) + beta*C",
     "usage: dspk-submit gemm A.npy B.npy [C.npy] [-o OUT.npy] [--trans-a]\n"
     "                        [--trans-b] [--alpha X] [--beta Y] [--device ID]\n"
     "                        [--json]\n"
     "\n"
     "Matrix product with numpy.matmul semantics (leading batch dimensions\n"
     "broadcast): OUT = alpha * op(A) @ op(B) + beta * C, where op transposes\n"
     "the last two axes when asked.  A (...,M,K), B (...,K,N); f32 or f64\n"
     "(both the same, the result too), or f16 (the result f32).\n"
     "\n"
     "  --trans-a              use the transpose of A\n"
     "  --trans-b              use the transpose of B\n"
     "  --alpha X              scale of the product (default 1)\n"
     "  --beta Y               scale of C (default 1 when C.npy is given)\n"
     "  -o, --output OUT.npy   write the result; without it, print a summary\n"
     "  -d, --device ID        device to run on (default any)\n"
     "      --json             print the result as JSON\n"
     INPUTS_HELP},
    {"fft", dspk__sub_fft, "FFT along the last axis",
     "usage: dspk-submit fft X.npy [-o Y.npy] [--inverse] [--device ID] [--json]\n"
     "\n"
     "Batched FFT along the last axis.  Complex X (c64, c128): numpy.fft.fft,\n"
     "or numpy.fft.ifft with --inverse (same normalisation as numpy).  Real X\n"
     "(f32, f64): numpy.fft.rfft, giving N/2+1 complex values.\n"
     "\n"
     "  --inverse              inverse transform (complex input only)\n"
     "  -o, --output Y.npy     write the result; without it, print a summary\n"
     "  -d, --device ID        device to run on (default any)\n"
     "      --json             print the result as JSON\n"
     INPUTS_HELP},
    {"fir", dspk__sub_fir, "causal FIR filter along the last axis",
     "usage: dspk-submit fir X.npy H.npy [-o Y.npy] [--device ID] [--json]\n"
     "\n"
     "Filters X along its last axis with the taps H (1-D, same dtype):\n"
     "Y = scipy.signal.lfilter(H, 1, X), same shape as X; f32, f64, c64, c128.\n"
     "\n"
     "  -o, --output Y.npy     write the result; without it, print a summary\n"
     "  -d, --device ID        device to run on (default any)\n"
     "      --json             print the result as JSON\n"
     INPUTS_HELP},
    {"contract", dspk__sub_contract, "two-operand einsum",
     "usage: dspk-submit contract SUBSCRIPTS A.npy B.npy [-o C.npy]\n"
     "                            [--device ID] [--json]\n"
     "\n"
     "Tensor contraction C = numpy.einsum(SUBSCRIPTS, A, B) with an explicit\n"
     "output, e.g. \"ik,kj->ij\", \"bij,bjk->bik\", \"abc,cd->abd\", \"ik,kj->ji\".\n"
     "\n"
     "  -o, --output C.npy     write the result; without it, print a summary\n"
     "  -d, --device ID        device to run on (default any)\n"
     "      --json             print the result as JSON\n"
     INPUTS_HELP},
    {"reduce", dspk__sub_reduce, "sum, max, min or mean over axes",
     "usage: dspk-submit reduce sum|max|min|mean X.npy [--axis K ...]\n"
     "                          [-o Y.npy] [--device ID] [--json]\n"
     "\n"
     "Reduces X over the given axes like X.sum(axis=...) (max, min, mean\n"
     "alike); over all axes when no --axis is given.\n"
     "\n"
     "  -a, --axis K[,K...]    axis to reduce (negative counts from the end);\n"
     "                         repeat or use commas for several (no empty\n"
     "                         item: 0, is refused; at most 8, none twice)\n"
     "  -o, --output Y.npy     write the result; without it, print a summary\n"
     "  -d, --device ID        device to run on (default any)\n"
     "      --json             print the result as JSON\n"
     INPUTS_HELP},
    {"map", dspk__sub_map, "elementwise add, sub, mul, scale, axpy, abs, exp",
     "usage: dspk-submit map FN A.npy [B.npy] [--alpha X] [-o Y.npy]\n"
     "                       [--device ID] [--json]\n"
     "\n"
     "Elementwise functions:\n"
     "  add, sub, mul   Y = A + B, A - B, A * B (same shapes)\n"
     "  scale           Y = alpha * A\n"
     "  axpy            Y = alpha * A + B\n"
     "  abs, exp        Y = |A|, exp(A)\n"
     "\n"
     "  --alpha X              the scalar of scale and axpy (default 1)\n"
     "  -o, --output Y.npy     write the result; without it, print a summary\n"
     "  -d, --device ID        device to run on (default any)\n"
     "      --json             print the result as JSON\n"
     INPUTS_HELP},
    {"kernel", dspk__sub_kernel, "run a raw kernel (CUDA C, HIP, GLSL, SPIR-V)",
     "usage: dspk-submit kernel SOURCE [--entry NAME] [--grid X[,Y[,Z]]]\n"
     "                          [--block X[,Y[,Z]]] [--shared SIZE]\n"
     "                          [--lang cuda|hip|glsl|spirv] [--device ID]\n"
     "                          [-o [K=]OUT.npy ...] [--json] [ARG ...]\n"
     "\n"
     "Compiles SOURCE (a file, or - for stdin) on the daemon (cached) and\n"
     "launches its kernel NAME.  The language comes from --lang or the\n"
     "extension (.cu cuda, .hip hip, .comp/.glsl glsl, .spv spirv; else\n"
     "cuda).  ARGs are the kernel's parameters, in order:\n"
     "  FILE.npy              a tensor (device pointer), initialised from FILE\n"
     "                        (or -, FILE.npz:NAME as for the other commands)\n"
     "  zeros:DTYPE:D0xD1...  a zero-filled tensor, e.g. zeros:f32:1024\n"
     "                        (DTYPE f32, f64, c64, c128, f16 or bf16)\n"
     "  i32:V u32:V i64:V f32:V f64:V   a scalar\n"
     "The kernel writes its results into its tensors; the daemon returns\n"
     "every tensor argument after the run.  At most 4 tensors, and at most\n"
     "16 ARGs in all; a zeros: tensor of at most 8 dimensions and 2^31\n"
     "elements.\n"
     "\n"
     "  -e, --entry NAME       the kernel function (default main; GLSL: always\n"
     "                         main, not used)\n"
     "  -g, --grid X[,Y[,Z]]   blocks in the grid (also XxYxZ: 16x16; default 1)\n"
     "  -b, --block X[,Y[,Z]]  threads per block (also XxYxZ; default 1; GLSL,\n"
     "                         SPIR-V: the shader's local_size, not used)\n"
     "  -s, --shared SIZE      dynamic shared memory (default 0; a size with\n"
     "                         units K, M...: 48K = 49152)\n"
     "  -l, --lang LANG        the source's language: cuda, hip, glsl or\n"
     "                         spirv (default: from the extension)\n"
     "  -o, --output [K=]FILE  save tensor argument K (0-based; any integer\n"
     "                         before '=' is an index: ./4=y.npy for such a\n"
     "                         file name; default: the one after the\n"
     "                         previous -o, from 0) as .npy;\n"
     "                         repeatable (one FILE per tensor); - for\n"
     "                         standard output.  Without -o, print\n"
     "                         summaries of every tensor\n"
     "  -d, --device ID        device to run on (default any)\n"
     "      --json             print the result as JSON\n"
     "\n"
     "A compilation error (ECOMPILE) carries the compiler's log.\n"},
    {"cache", dspk__sub_cache, "the daemon's cache of kernels and tunings",
     "usage: dspk-submit cache stats [--json]\n"
     "       dspk-submit cache clear [--kernels] [--autotune] [--blobs] [--json]\n"
     "\n"
     "stats shows the daemon's persistent cache (compiled kernels, autotune\n"
     "decisions, blobs): entries, bytes, hits and misses per kind, one\n"
     "\"field value\" line each.\n"
     "clear deletes the entries of the kinds named (no flag: every kind);\n"
     "only the daemon's admins may (root, the user the daemon runs as, and\n"
     "admin_users/admin_groups of dspkd.conf; EPERM otherwise).\n"
     "A daemon without a cache (no_cache, --no-cache) answers both with\n"
     "ENOENT (exit status 1).\n"
     "\n"
     "  --kernels    clear: the compiled kernels\n"
     "  --autotune   clear: the autotune decisions\n"
     "  --blobs      clear: the blobs\n"
     "  --json       print the daemon's answer as JSON\n"},
    {"metrics", dspk__sub_metrics, "the daemon's metrics (Prometheus text)",
     "usage: dspk-submit metrics [--json]\n"
     "\n"
     "Prints the daemon's counters in Prometheus text format: per device tasks\n"
     "by op and result, queue and run time histograms, queue depth, memory,\n"
     "busy fraction, retirement counters; cache hits, misses, puts and\n"
     "evictions;\n"
     "connections, bytes in and out, uptime.  (dspkd --metrics-listen serves\n"
     "the same text over HTTP for Prometheus to scrape.)\n"
     "\n"
     "  --json   print the samples as a JSON list of {name, labels, value}\n"},
    {"top", dspk__sub_top, "live view of the devices and clients",
     "usage: dspk-submit top [-n SECONDS] [--once] [--json]\n"
     "\n"
     "Shows, refreshed every SECONDS, one line per device: BUSY (share of the\n"
     "last 4 to 5 seconds spent running jobs), memory the daemon's pool has in\n"
     "use and cached of the device's total, queued jobs, clients with work on\n"
     "it, jobs done and failed, and the job RUNNING now with its age; then the\n"
     "connected clients.  Keys: q quits, space refreshes.\n"
     "\n"
     "  -n, --interval SECONDS   time between refreshes (0.1 to 3600, default 1)\n"
     "      --once               print one frame and exit\n"
     "      --json               print one frame's data (the status answer) as JSON\n"},
    {"trace", dspk__sub_trace, "record what the devices run (Chrome trace JSON)",
     "usage: dspk-submit trace -o FILE [--seconds N] [--json]\n"
     "\n"
     "Records the jobs of the devices status shows you for N seconds (default\n"
     "5, at most 600) and writes Chrome trace-event JSON that Perfetto\n"
     "(ui.perfetto.dev) and chrome://tracing open: one process per device; on\n"
     "its runner thread each job with its phases (upload, compute, tuning,\n"
     "download), and on a thread per client the time each job waited in the\n"
     "queue.  Unless you are an admin of the daemon, another user's jobs are\n"
     "slices named other (when the device was busy, not with what or whose).\n"
     "FILE is created before the recording starts (a bad FILE fails at once)\n"
     "as a temporary beside it, renamed over FILE once the trace is written\n"
     "whole.\n"
     "\n"
     "  -o, --output FILE   where to write the trace (- for standard output)\n"
     "  -s, --seconds N     how long to record (more than 0, at most 600;\n"
     "                      default 5)\n"
     "      --json          then print {\"output\":..,\"seconds\":..,\"jobs\":..,\"dropped\":..}\n"},
    {"job", dspk__sub_job, "register or end a Slurm job (prolog, epilog; admin)",
     "usage: dspk-submit job register [--job ID] [--uid UID] [--devices UUID,...] [--json]\n"
     "       dspk-submit job end [--job ID] [--json]\n"
     "\n"
     "What the Slurm prolog and epilog of a node call (docs/cluster.md); only\n"
     "the daemon's admins may (EPERM otherwise).\n"
     "register tells the daemon that job ID runs as UID with the GPUs whose\n"
     "UUIDs are listed (none: the cpu only); its clients then see and use\n"
     "those devices and the cpu, and others answer ENODEV.\n"
     "end closes the job's connections (queued and running work canceled,\n"
     "buffers freed) and returns once nothing of the job is left.\n"
     "\n"
     "  --job ID            the Slurm job id (default $SLURM_JOB_ID), no leading\n"
     "                      zero (043 is refused, as everywhere)\n"
     "  --uid UID           register only: the uid the job runs as (default\n"
     "                      $SLURM_JOB_UID), 0 to 4294967294, no leading zero\n"
     "  --devices UUID,...  register only: the job's GPUs by UUID, comma\n"
     "                      separated, no empty item (as devices lists them;\n"
     "                      dashes, case and a GPU- prefix do not matter);\n"
     "                      hex digits and dashes only, at most 39 digits;\n"
     "                      at most 64 UUIDs (4095 bytes)\n"
     "  --json              print the daemon's answer as JSON\n"},
    {NULL, NULL, NULL, NULL},
};

static const char prog_help[] =
    "usage: dspk-submit [--socket PATH] COMMAND [ARGS...]\n"
    "       dspk-submit COMMAND --help\n"
    "\n"
    "Submits work to dspkd, the dspk compute daemon.  Arrays are numpy .npy\n"
    "files (little-endian f2, f4, f8, c8, c16; C order), - for standard input\n"
    "or output, or FILE.npz:NAME.  Every command but help takes --json.  An\n"
    "option that takes a value may be given once (given twice: a bad command\n"
    "line), except reduce --axis and kernel -o, which add up.\n"
    "\n"
    "Options:\n"
    "  -S, --socket PATH   daemon socket (default: $DSPK_SOCKET when set and\n"
    "                      not empty; else /run/dspk/dspkd.sock as root or in\n"
    "                      a Slurm job ($SLURM_JOB_ID set); else\n"
    "                      $XDG_RUNTIME_DIR/dspk/dspkd.sock, or\n"
    "                      /run/dspk/dspkd.sock without an absolute\n"
    "                      XDG_RUNTIME_DIR)\n"
    "  -h, --help          show this help\n"
    "  -V, --version       show the version\n"
    "\n"
    "Commands:\n";

static void print_prog_help(FILE *f) {
  const dspk__sub_cmd *c;
  fputs(prog_help, f);
  for (c = dspk__sub_cmds; c->name != NULL; c++)
    fprintf(f, "  %-10s %s\n", c->name, c->summary);
  /* help is a command (SYNOPSIS: help [COMMAND]) but not one of the
   * table's: listed too, so that the completion, which reads this list,
   * offers it (probe 21 D-5). */
  fprintf(f, "  %-10s %s\n", "help", "this list, or a command's usage (help [COMMAND])");
  fputs("\nExit status: 0 on success, 1 when the operation failed, 2 for a "
        "bad command line.\n",
        f);
}

static const dspk__sub_cmd *find_cmd(const char *name) {
  const dspk__sub_cmd *c;
  for (c = dspk__sub_cmds; c->name != NULL; c++)
    if (strcmp(c->name, name) == 0)
      return c;
  return NULL;
}

int dspk__sub_help(const dspk__sub_ctx *ctx) {
  const dspk__sub_cmd *c = find_cmd(ctx->cmd);
  if (c == NULL)
    print_prog_help(stdout);
  else
    fputs(c->help, stdout);
  return DSPK__SUB_EXIT_OK;
}

/* Writes msg to stderr as one line: newlines become "; " and every other
 * control character is escaped (escape.h), whoever wrote the message. */
static void put_one_line(char *msg) {
  size_t len = strlen(msg);
  while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == ' '))
    len--;
  msg[len] = '\0';
  dspk__sub_put(stderr, msg, DSPK__SUB_ESC_LINE);
}

static void vreport(const dspk__sub_ctx *ctx, const char *name,
                    const char *fmt, va_list ap) {
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  fputs(PROG ": ", stderr);
  if (ctx != NULL && ctx->cmd != NULL)
    fprintf(stderr, "%s: ", ctx->cmd);
  fprintf(stderr, "%s: ", name);
  put_one_line(buf);
  fputc('\n', stderr);
}

int dspk__sub_fail(const dspk__sub_ctx *ctx, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(ctx, dspk_err_name(code), fmt, ap);
  va_end(ap);
  return DSPK__SUB_EXIT_FAIL;
}

int dspk__sub_usage(const dspk__sub_ctx *ctx, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (ctx != NULL && ctx->cmd != NULL)
    dspk__sub_fail(ctx, DSPK_EINVAL, "%s (see '" PROG " %s --help')", buf,
                   ctx->cmd);
  else
    dspk__sub_fail(ctx, DSPK_EINVAL, "%s (see '" PROG " --help')", buf);
  return DSPK__SUB_EXIT_USAGE;
}

/* The task.run fields a command line sets, with the command line's name
 * for each (docs/protocol.md, task.run; docs/cli.md). */
static const struct {
  const char *wire, *cli;
} wire_names[] = {
    {"options.axes", "--axis"},        {"options.alpha", "--alpha"},
    {"options.beta", "--beta"},        {"options.trans_a", "--trans-a"},
    {"options.trans_b", "--trans-b"},  {"options.inverse", "--inverse"},
    {"options.subscripts", "SUBSCRIPTS"}, {"options.fn", "FN"},
    {"options.entry", "--entry"},      {"options.grid", "--grid"},
    {"options.block", "--block"},      {"options.shared", "--shared"},
    {"options.lang", "--lang"},        {"options.source", "SOURCE"},
    {"options.args", "ARG"},           {"inputs", "the arrays"},
    {"devices", "--devices"}, /* job register's; only its items ("devices[1]") */
    /* gemm's "A has K=2 (axis 0, trans_a)": the option's field, bare */
    {"trans_a", "--trans-a"},          {"trans_b", "--trans-b"},
};

/* Whether s[i] starts a word (not inside a longer name). */
static bool word_start(const char *s, size_t i) {
  char c = i > 0 ? s[i - 1] : ' ';
  return !(c == '_' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9'));
}

/* The daemon's detail d with its wire names said as the command line says
 * them, into out: "options.axes[0]: " becomes "--axis: ", "options.args[2]"
 * "ARG 2 (0-based)", "input 1" the second input file. */
static void cli_words(const dspk__sub_ctx *ctx, const char *d, char *out, size_t cap) {
  size_t w = 0;
  out[0] = '\0';
  for (size_t i = 0; d[i] != '\0' && w + 1 < cap;) {
    const char *rep = NULL;
    size_t skip = 0;
    char num[600];
    if (word_start(d, i)) {
      for (size_t k = 0; k < sizeof wire_names / sizeof wire_names[0]; k++) {
        size_t n = strlen(wire_names[k].wire);
        char c;
        if (strncmp(d + i, wire_names[k].wire, n) != 0)
          continue;
        c = d[i + n];
        if (c == '_' || c == '.' || (c >= 'a' && c <= 'z'))
          continue; /* a longer name */
        /* "inputs" is also an English word: only the field ("inputs:",
         * "inputs[1]") is renamed. */
        if (strcmp(wire_names[k].wire, "inputs") == 0 && c != ':' && c != '[')
          break;
        rep = wire_names[k].cli;
        skip = n;
        if (c == '[') { /* an item: the axis, argument or input by its number */
          size_t e = strspn(d + i + n + 1, "0123456789");
          long item = e > 0 && e < 4 ? strtol(d + i + n + 1, NULL, 10) : -1;
          if (e > 0 && d[i + n + 1 + e] == ']') {
            if (strcmp(rep, "ARG") == 0) {
              snprintf(num, sizeof num, "ARG %.*s (0-based)", (int)e, d + i + n + 1);
              rep = num;
            } else if (strcmp(rep, "--devices") == 0 && item >= 0) {
              /* counted from 1, as the command line's own messages count */
              snprintf(num, sizeof num, "--devices item %ld", item + 1);
              rep = num;
            } else if (strcmp(wire_names[k].wire, "inputs") == 0 && ctx->inputs != NULL &&
                       item >= 0 && item < ctx->ninputs) {
              snprintf(num, sizeof num, "%s", ctx->inputs[item]);
              rep = num;
            }
            skip += e + 2;
          }
          if ((strcmp(wire_names[k].wire, "inputs") == 0 ||
               strcmp(wire_names[k].wire, "devices") == 0) && rep != num) {
            rep = NULL; /* "inputs[" of something else: left as it is */
            skip = 0;
          }
        } else if (strcmp(wire_names[k].wire, "devices") == 0) {
          rep = NULL; /* the word, not the field */
          skip = 0;
        }
        break;
      }
      if (rep == NULL && ctx->inputs != NULL && strncmp(d + i, "input ", 6) == 0) {
        size_t e = strspn(d + i + 6, "0123456789");
        char c = d[i + 6 + e];
        long k = e > 0 && e < 4 ? strtol(d + i + 6, NULL, 10) : -1;
        if (k >= 0 && k < ctx->ninputs && !(c >= '0' && c <= '9')) {
          snprintf(num, sizeof num, "%s", ctx->inputs[k]);
          rep = num;
          skip = 6 + e;
        }
      }
    }
    if (rep == NULL) {
      out[w++] = d[i++];
      continue;
    }
    w += (size_t)snprintf(out + w, cap - w, "%s", rep);
    if (w >= cap)
      w = cap - 1;
    i += skip;
  }
  out[w] = '\0';
}

/* The daemon's remedy for a result too large for one response is a
 * protocol one (a task.run that writes into a buffer), which the command
 * line does not offer: said instead as what a shell user can do. */
static const char too_big_advice[] =
    ": write it into a buffer (task.run outputs: [{buffer, offset}])";

/* detail with a protocol remedy (too_big_advice) replaced by the command
 * line's, into out; 0 when detail has none. */
static int cli_remedy(const dspk__sub_ctx *ctx, const char *detail, char *out, size_t cap) {
  const char *adv = strstr(detail, too_big_advice), *n;
  unsigned long long bytes = 0;
  char shm[300] = "";
  const char *cmd = ctx->cmd != NULL ? ctx->cmd : "";
  if (adv == NULL)
    return 0;
  n = strstr(detail, "the inline result would be ");
  if (n != NULL)
    bytes = strtoull(n + strlen("the inline result would be "), NULL, 10);
  /* Results of these that cannot come inline come back through a shared
   * temporary whatever DSPK_SHARED_THRESHOLD (dspk.h), except on "any"
   * when the daemon has a GPU (the library leaves it the daemon's choice):
   * the only way here to this ELIMIT, and a named device its remedy. */
  if (bytes >= 1024 && (strcmp(cmd, "gemm") == 0 || strcmp(cmd, "fft") == 0 ||
                        strcmp(cmd, "fir") == 0 || strcmp(cmd, "map") == 0))
    snprintf(shm, sizeof shm,
             "run it with a --device other than any (the daemon has a GPU) to have it "
             "come back through shared memory, or ");
  snprintf(out, cap, "%.*s: too large for one message of this daemon; %sask the daemon's "
           "admin to raise max_message (dspkd --max-message, [limits] max_message of "
           "dspkd.conf, dspk.conf(5))%s",
           (int)(adv - detail), detail, shm, adv + strlen(too_big_advice));
  return 1;
}

/* The library's remedy for a task.run request over max_message is an API's
 * (buffer references, shared memory; dspk.h): the command line already
 * sends what it can through buffers, so what is left to do is the
 * daemon's admin's; and so for a max_message that leaves a buffer.write no
 * room for data (the command line's way for big inputs).  detail so said
 * into out; 0 when it is no such. */
static int cli_request_remedy(const char *detail, char *out, size_t cap) {
  static const char req[] = "task.run request of ", lim[] = "(max_message)",
                    bw[] = "dspk_buffer_write: the daemon's max_message (";
  const char *e = strstr(detail, lim);
  if (strncmp(detail, bw, sizeof bw - 1) == 0) {
    snprintf(out, cap, "an input too large for the task's message goes through daemon "
             "buffers, but the daemon's max_message (%.*s leaves no room for data in a "
             "buffer write; ask the daemon's admin to raise max_message (dspkd "
             "--max-message, [limits] max_message of dspkd.conf, dspk.conf(5))",
             (int)strcspn(detail + sizeof bw - 1, ")") + 1, detail + sizeof bw - 1);
    return 1;
  }
  if (strncmp(detail, req, sizeof req - 1) != 0 || e == NULL)
    return 0;
  snprintf(out, cap, "the task's request of %.*s: too large for one message of this daemon; "
           "ask the daemon's admin to raise max_message (dspkd --max-message, [limits] "
           "max_message of dspkd.conf, dspk.conf(5))",
           (int)(e + sizeof lim - 1 - (detail + sizeof req - 1)), detail + sizeof req - 1);
  return 1;
}

int dspk__sub_fail_client_at(const dspk__sub_ctx *ctx, int code, const char *prefix) {
  const char *detail = ctx->client ? dspk_last_error(ctx->client) : "";
  const char *sep = prefix && *prefix ? ": " : "";
  char words[2048], remedy[2048];
  if (!prefix)
    prefix = "";
  if (detail == NULL || detail[0] == '\0')
    detail = dspk_strerror(code);
  /* A compiler's log quotes the user's own source: left as it is. */
  if (code == DSPK_ECOMPILE)
    return dspk__sub_fail(ctx, code, "%s%s%s", prefix, sep, detail);
  if (code == DSPK_ELIMIT && (cli_remedy(ctx, detail, remedy, sizeof remedy) ||
                              cli_request_remedy(detail, remedy, sizeof remedy)))
    detail = remedy;
  cli_words(ctx, detail, words, sizeof words);
  return dspk__sub_fail(ctx, code, "%s%s%s", prefix, sep, words);
}

int dspk__sub_fail_client(const dspk__sub_ctx *ctx, int code) {
  return dspk__sub_fail_client_at(ctx, code, NULL);
}

/* The size variables of cli.md's "Sizes" with their bounds; main() refuses
 * a malformed one (exit 2) before any command runs, so the readers below
 * only ever see a good value or none. */
static const struct {
  const char *name;
  uint64_t max;
} size_env[] = {{"DSPK_SHARED_THRESHOLD", (uint64_t)1 << 40},
                {"DSPK_SUBMIT_INLINE_MAX", (uint64_t)1 << 40}};

/* Whether $DSPK_JOB, when set and not empty, is a Slurm job id as
 * libdspkclient sends it in hello (dspk.h, dspk_connect): a decimal number
 * from 1 to 2^64-1 without leading zeros, signs or blanks. */
static bool job_env_ok(void) {
  const char *e = getenv("DSPK_JOB");
  char *end;
  if (e == NULL || *e == '\0')
    return true;
  if (*e < '1' || *e > '9')
    return false;
  errno = 0;
  (void)strtoull(e, &end, 10);
  return errno == 0 && *end == '\0';
}

/* A bad variable is a bad command line (exit 2), but not one that the
 * command's --help would explain: the message says what a size is (a job
 * id, for $DSPK_JOB, which the library would refuse at connect). */
static int check_size_env(const dspk__sub_ctx *ctx) {
  if (!job_env_ok()) {
    dspk__sub_fail(ctx, DSPK_EINVAL, "bad value of $DSPK_JOB '%s': want a Slurm job id, a "
                   "decimal number from 1 to 18446744073709551615 without leading zeros, "
                   "signs or blanks; unset it for $SLURM_JOB_ID's",
                   dspk__sub_arg(getenv("DSPK_JOB")));
    return DSPK__SUB_EXIT_USAGE;
  }
  for (size_t i = 0; i < sizeof size_env / sizeof size_env[0]; i++) {
    const char *e = getenv(size_env[i].name);
    uint64_t v;
    if (e != NULL && *e && dspk__sub_parse_size(e, 0, size_env[i].max, &v) < 0) {
      dspk__sub_fail(ctx, DSPK_EINVAL, "bad value of $%s '%s': want a size of at most "
                     "1T, " DSPK__SIZE_UNITS " (no sign, spaces or fractions); unset "
                     "it for the default",
                     size_env[i].name, dspk__sub_arg(e));
      return DSPK__SUB_EXIT_USAGE;
    }
  }
  return 0;
}

/* Whether a command's arguments (args[0] its name) ask for its help: -h or
 * --help before any "--". */
static bool asks_help(int n, char **args) {
  for (int i = 1; i < n && strcmp(args[i], "--") != 0; i++)
    if (strcmp(args[i], "-h") == 0 || strcmp(args[i], "--help") == 0)
      return true;
  return false;
}

size_t dspk__sub_shared_threshold(void) {
  const char *e = getenv("DSPK_SHARED_THRESHOLD");
  uint64_t v;
  /* Unset: never.  A command is one short process: every page of a fresh
   * memfd is allocated and mapped on both sides once and then thrown away,
   * while the daemon's socket buffers are mapped already.  Measured
   * (docs/performance.md): a fresh gemm 1024^2 from .npy files on an H200
   * 14 ms through the socket, 18-25 ms through shared memory; a reduce of
   * 256 MiB on cpu:0 on the development VM 0.11 s against 0.40 s. */
  if (e != NULL && *e && dspk__sub_parse_size(e, 0, (uint64_t)1 << 40, &v) == 0)
    return (size_t)v;
  return 0;
}

static const char *owner_name(uid_t uid, char *buf, size_t cap) {
  struct passwd *pw = getpwuid(uid);
  if (pw != NULL)
    snprintf(buf, cap, "'%s'", pw->pw_name);
  else
    snprintf(buf, cap, "uid %ld", (long)uid);
  return buf;
}

static const char *group_name(gid_t gid, char *buf, size_t cap) {
  struct group *g = getgrgid(gid);
  if (g != NULL)
    snprintf(buf, cap, "'%s'", g->gr_name);
  else
    snprintf(buf, cap, "gid %ld", (long)gid);
  return buf;
}

/* Whether this process's effective group or one of its supplementary
 * groups is gid (the kernel then applies the mode's group bits to it). */
static bool in_group(gid_t gid) {
  gid_t gs[256];
  int n;
  if (getegid() == gid)
    return true;
  n = getgroups((int)(sizeof gs / sizeof gs[0]), gs);
  for (int i = 0; i < n; i++)
    if (gs[i] == gid)
      return true;
  return false;
}

/* Whom mode's write bits let connect, as the kernel decides: the owner by
 * the owner bits alone, members of the group by the group bits, everyone
 * else by the other bits ("users outside group G"). */
static void who_may(mode_t mode, const char *gn, char *buf, size_t cap) {
  const char *who[3];
  char other[340];
  int n = 0;
  snprintf(other, sizeof other, "users outside group %s", gn);
  if (mode & S_IWUSR)
    who[n++] = "its owner";
  if (mode & S_IWGRP)
    who[n++] = "members of its group";
  if (mode & S_IWOTH)
    who[n++] = other;
  if (n == 0)
    snprintf(buf, cap, "no one");
  else if (n == 1)
    snprintf(buf, cap, "%s%s", mode & S_IWUSR ? "only " : "", who[0]);
  else if (n == 2)
    snprintf(buf, cap, "%s and %s", who[0], who[1]);
  else
    snprintf(buf, cap, "%s, %s and %s", who[0], who[1], who[2]);
}

/* The hint for EPERM on connecting to path (not the daemon's own policy):
 * connecting needs search permission on every directory of the path and
 * write permission on the socket, so the first directory that refuses is
 * named; else who the socket's mode lets in, by the kernel's order (the
 * owner's bits for the owner, the group's for its members, the other bits
 * for everyone else: a member of the group is refused by 0606 that lets
 * every other user in).  Asking to join the socket's group is advice only
 * where that group may write to it, this user is not in it already, and it
 * is not group root (gid 0), which no admin adds users to for this. */
static void eperm_hint(const char *path, char *hint, size_t cap) {
  char dir[512], on[300], gn[300], who[720];
  struct stat st;
  size_t len = strlen(path);
  if (dspk__sock_is_abstract(path)) /* no file, no mode: nothing to explain */
    return;
  if (len >= sizeof dir)
    return;
  /* Each directory from the root down: "/a", "/a/b" for "/a/b/s". */
  memcpy(dir, path, len + 1);
  for (char *p = strchr(dir + 1, '/'); p != NULL; p = strchr(p + 1, '/')) {
    *p = '\0';
    if (faccessat(AT_FDCWD, dir, X_OK, AT_EACCESS) != 0 && errno == EACCES &&
        stat(dir, &st) == 0) {
      snprintf(hint, cap, "; the directory %s (mode %04o, owner %s, group %s) does not "
               "let this user reach the socket: the daemon's admin decides who may",
               dir, (unsigned)(st.st_mode & 07777), owner_name(st.st_uid, on, sizeof on),
               group_name(st.st_gid, gn, sizeof gn));
      return;
    }
    *p = '/';
  }
  if (stat(path, &st) != 0)
    return;
  group_name(st.st_gid, gn, sizeof gn);
  bool owner = st.st_uid == geteuid(), member = !owner && in_group(st.st_gid);
  if ((st.st_mode & S_IWGRP) && !owner && !member && st.st_gid != 0) {
    struct group *g = getgrgid(st.st_gid);
    if (g != NULL)
      snprintf(hint, cap, "; the socket belongs to group '%s' (mode %04o): ask to be "
               "added to it ('sudo usermod -aG %s USER', then log in again)",
               g->gr_name, (unsigned)(st.st_mode & 07777), g->gr_name);
    else
      snprintf(hint, cap, "; the socket's group (gid %ld, mode %04o) decides who may "
               "connect", (long)st.st_gid, (unsigned)(st.st_mode & 07777));
    return;
  }
  who_may(st.st_mode, gn, who, sizeof who);
  snprintf(hint, cap, "; the socket's mode %04o (owner %s, group %s) lets %s connect: %s; "
           "the daemon's admin decides who may (SocketMode= and SocketGroup= of "
           "dspkd.socket)",
           (unsigned)(st.st_mode & 07777), owner_name(st.st_uid, on, sizeof on), gn, who,
           owner    ? "not its owner, which this user is"
           : member ? "not members of its group, which this user is"
           : (st.st_mode & S_IWGRP)
               ? "joining group root is not the way to be let in"
               : "joining its group would not help");
}

int dspk__sub_connect(dspk__sub_ctx *ctx) {
  char path[512];
  const char *shown = ctx->socket;
  int rc;
  if (ctx->client != NULL)
    return 0;
  rc = dspk_connect(ctx->socket, PROG, &ctx->client);
  if (rc == 0) {
    /* Results too: the library's default (1 MiB) is for long-lived clients. */
    dspk_set_shared_threshold(ctx->client, dspk__sub_shared_threshold());
    return 0;
  }
  if (shown == NULL) {
    const char *env = getenv("DSPK_SOCKET");
    shown = dspk_default_socket(path, sizeof path) == 0 ? path
            : env != NULL && *env                        ? "$DSPK_SOCKET"
                                                         : "(default)";
  }
  {
    const char *why = dspk_connect_error();
    char pre[600], hint[2048] = "";
    struct stat st;
    if (why == NULL || why[0] == '\0')
      why = dspk_strerror(rc);
    /* The library says "connect to PATH: reason", PATH shown as
     * dspk__sub_arg shows it; PATH is named once. */
    snprintf(pre, sizeof pre, "connect to %s: ", dspk__sub_arg(shown));
    if (strncmp(why, pre, strlen(pre)) == 0)
      why += strlen(pre);
    /* A path the library was given: it came from --socket (cli.md). */
    static const char too_long[] = "socket path longer than ";
    if (rc == DSPK_ELIMIT && ctx->socket != NULL &&
        strncmp(why, too_long, sizeof too_long - 1) == 0) {
      snprintf(hint, sizeof hint, "socket path from --socket longer than %s",
               why + sizeof too_long - 1);
      return dspk__sub_fail(ctx, rc, "cannot connect to %s: %s", dspk__sub_arg(shown), hint);
    }
    if ((rc == DSPK_ECONNECT || (rc == DSPK_EPERM && strstr(why, "allow_") == NULL)) &&
        !dspk__sock_is_abstract(shown) && stat(shown, &st) == 0 && !S_ISSOCK(st.st_mode)) {
      /* Something is there, but no socket a daemon could listen on (EPERM
       * too, where this user may not write it: no mode would help).  The
       * library names it so already for ECONNECT, in the words of
       * proto/sockpath.h; this line uses the same ones otherwise. */
      char ns[600];
      dspk__not_socket(ns, sizeof ns, shown, strlen(shown), st.st_mode);
      if (strcmp(why, ns) == 0)
        snprintf(hint, sizeof hint, ": check --socket and $DSPK_SOCKET");
      else
        snprintf(hint, sizeof hint, "; %s: check --socket and $DSPK_SOCKET", ns);
    } else if (rc == DSPK_ECONNECT) {
      snprintf(hint, sizeof hint,
               "; is dspkd running? See 'systemctl status dspkd.socket "
               "dspkd.service' (or 'systemctl --user ...'), or start one with "
               "'dspkd --foreground'");
    } else if (rc == DSPK_EPERM && strstr(why, "allow_") == NULL) {
      eperm_hint(shown, hint, sizeof hint);
    }
    return dspk__sub_fail(ctx, rc, "cannot connect to %s: %s%s", dspk__sub_arg(shown), why,
                          hint);
  }
}

/* What strtol and strtod accept beyond a plain number, and the command
 * line does not (cli.md, "Numbers"): leading blanks, a '+' sign, and
 * (strtod) hexadecimal "0x1p4".  Returns whether s has none of them. */
static bool plain_number(const char *s) {
  const char *p = s + (s[0] == '-');
  /* The words, as Python's float() takes them (any case); not strtod's
   * "nan(chars)". */
  if (*p == 'i' || *p == 'I' || *p == 'n' || *p == 'N')
    return strcasecmp(p, "inf") == 0 || strcasecmp(p, "infinity") == 0 ||
           strcasecmp(p, "nan") == 0;
  if (s[0] == '\0' || !(*p == '.' || (*p >= '0' && *p <= '9')))
    return false;
  return !(p[0] == '0' && (p[1] == 'x' || p[1] == 'X'));
}

int dspk__sub_parse_double(const char *s, double *out) {
  char *end;
  double v;
  if (s == NULL || !plain_number(s))
    return -1;
  errno = 0;
  v = strtod(s, &end);
  if (*end != '\0')
    return -1;
  /* ERANGE with a finite result is an underflow: v is then the nearest
   * subnormal or 0, a number in range (Python reads 1e-310 the same). */
  if (errno == ERANGE && isinf(v))
    return -2;
  *out = v;
  return 0;
}

int dspk__sub_parse_long(const char *s, long lo, long hi, long *out) {
  char *end;
  long v;
  if (s == NULL || !plain_number(s))
    return -1;
  errno = 0;
  v = strtol(s, &end, 10);
  if (*end != '\0' || errno == ERANGE || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

int dspk__sub_parse_size(const char *s, uint64_t lo, uint64_t hi,
                         uint64_t *out) {
  uint64_t v;
  if (dspk__parse_size(s, &v) != 0 || v < lo || v > hi)
    return -1;
  *out = v;
  return 0;
}

/* The option getopt_long just refused, as the user typed it.  For a long
 * option ("--json=1", "--nosuch") getopt_long has moved past its word, so
 * it is argv[optind - 1], and optopt is the option's value in its table
 * (the short letter, or a code above 127 for a long-only option such as
 * --trans-a), or 0 for a name not in the table: never a letter the user
 * typed.  For a short option optopt is the letter. */
static bool long_token(char **argv, const char **tok) {
  *tok = optind >= 1 ? argv[optind - 1] : "";
  return strncmp(*tok, "--", 2) == 0 && (*tok)[2] != '\0';
}

/* The short option getopt_long just refused for its byte b, outside ASCII
 * (the lead byte of a UTF-8 character, or any byte of an invalid one), as
 * "-" and the character it begins into buf (8 bytes): getopt_long reads a
 * word byte by byte, so b is one byte of what the user typed.  While the
 * word goes on after b getopt_long stays on it (argv[optind]: "-é" leaves
 * the continuation byte); where b ended it, it has moved past
 * (argv[optind - 1]: "-\xff").  In the word the bytes before b are options
 * taken (ASCII), so b's first place in it is b. */
static const char *non_ascii_short(char **argv, unsigned char b, char *buf) {
  const char *w = NULL, *at;
  size_t n = 1;
  if (argv[optind] != NULL && argv[optind][0] == '-' &&
      (at = strchr(argv[optind] + 1, (char)b)) != NULL)
    w = at;
  else if (optind >= 1 && (at = strrchr(argv[optind - 1], (char)b)) != NULL && at[1] == '\0')
    w = at;
  if (w == NULL) {
    snprintf(buf, 8, "-%c", (char)b);
    return buf;
  }
  /* The continuation bytes of the character b leads (at most 3). */
  while (b >= 0xc0 && n < 4 && ((unsigned char)w[n] & 0xc0) == 0x80)
    n++;
  buf[0] = '-';
  memcpy(buf + 1, w, n);
  buf[1 + n] = '\0';
  return buf;
}

/* The word "-:NAME" that getopt_long just refused at its ':' (in the word
 * at optind, or the one before when the ':' ended it), else NULL: an .npz
 * member asked of standard input, which gives one .npy. */
static const char *stdin_member(char **argv) {
  if (optopt != ':')
    return NULL;
  for (int i = optind; i >= 1 && i >= optind - 1; i--)
    if (argv[i] != NULL && strncmp(argv[i], "-:", 2) == 0)
      return argv[i];
  return NULL;
}

/* The long options of opts that tok[0..len) ("--t") abbreviates, as
 * "--trans-a, --trans-b" into buf; returns how many. */
static int abbreviated(const struct option *opts, const char *tok, size_t len, char *buf,
                       size_t cap) {
  size_t w = 0;
  int n = 0;
  buf[0] = '\0';
  for (const struct option *o = opts; o != NULL && o->name != NULL; o++) {
    if (strncmp(o->name, tok + 2, len - 2) != 0)
      continue;
    int k = snprintf(buf + w, cap - w, "%s--%s", n ? ", " : "", o->name);
    if (k > 0 && (size_t)k < cap - w)
      w += (size_t)k;
    n++;
  }
  return n;
}

/* The options before COMMAND ('+': stop at the command name; its options
 * are its own), and every command's, for an option given to the wrong one. */
static const struct option global_opts[] = {{"socket", required_argument, NULL, 'S'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
                                            {NULL, 0, NULL, 0}};
#define GLOBAL_WHO PROG " before COMMAND"
#define BEFORE_SUB "before SUBCOMMAND"
static const dspk__sub_optset global_optsets[] = {
    {GLOBAL_WHO, "+:S:hV", global_opts, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL}};
/* metrics takes --json alone (dspk__sub_json_only; cache stats has its
 * own row). */
static const struct option json_only_opts[] = {DSPK__SUB_OPTS_END};
static const dspk__sub_optset json_only_optsets[] = {
    {"metrics", ":h", json_only_opts, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL}};
static const dspk__sub_optset *const option_sets[] = {
    global_optsets,           dspk__sub_info_optsets,  json_only_optsets,
    dspk__sub_op_optsets,     dspk__sub_kernel_optsets, dspk__sub_cache_optsets,
    dspk__sub_top_optsets,    dspk__sub_trace_optsets, dspk__sub_job_optsets,
    NULL};

/* Whether opts has the long option name. */
static bool has_option(const struct option *opts, const char *name) {
  for (const struct option *o = opts; o->name != NULL; o++)
    if (strcmp(o->name, name) == 0)
      return true;
  return false;
}

/* The long option of opts that the letter c of its optstring shorts stands
 * for, or NULL when c is none of its letters. */
static const struct option *short_option(const dspk__sub_optset *s, int c) {
  if (c == ':' || c == '+' || strchr(s->shorts, c) == NULL)
    return NULL;
  for (const struct option *o = s->opts; o->name != NULL; o++)
    if (o->val == c)
      return o;
  return NULL;
}

/* Appends the text of fmt to buf (cap bytes, w used so far). */
static void append(char *buf, size_t cap, size_t *w, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *w, const char *fmt, ...) {
  va_list ap;
  int k;
  if (*w >= cap)
    return;
  va_start(ap, fmt);
  k = vsnprintf(buf + *w, cap - *w, fmt, ap);
  va_end(ap);
  *w = k < 0 ? *w : *w + (size_t)k < cap ? *w + (size_t)k : cap - 1;
}

/* Whether set s takes the long option name; with a letter c (not 0), as
 * what c stands for there. */
static bool takes(const dspk__sub_optset *s, const char *name, int c) {
  const struct option *o = c ? short_option(s, c) : NULL;
  return c ? o != NULL && strcmp(o->name, name) == 0 : has_option(s->opts, name);
}

/* Whether set s is a subcommand of the command scope ("cache": "cache
 * stats", "cache clear"); every set when scope is NULL. */
static bool in_scope(const dspk__sub_optset *s, const char *scope) {
  size_t n = scope ? strlen(scope) : 0;
  return scope == NULL || (strncmp(s->who, scope, n) == 0 && s->who[n] == ' ');
}

/* Appends "an option of gemm, fft and kernel" for the long option name to
 * buf: the commands other than own that take it (with a letter c, not 0:
 * that take c for it).  Given before COMMAND (own is its options), "every
 * command but help" when all of them take it by name (help, which takes no
 * option but -h/--help, has no row in option_sets; probe 22 D1: it said
 * "every command", which help --json belied).  Given before a subcommand of
 * scope (not NULL), the subcommands of scope that take it, when some do:
 * "an option of cache stats and cache clear", not "every command" (which
 * the refusal would belie). */
static void owners(const struct option *own, const char *scope, const char *name, int c,
                   char *buf, size_t cap, size_t *w) {
  int n = 0, others = 0, k = 0;
  for (int pass = 0; pass < 2 && n == 0; pass++) {
    if (pass == 1)
      scope = NULL;
    for (int i = 0; option_sets[i] != NULL; i++)
      for (const dspk__sub_optset *s = option_sets[i]; s->who != NULL; s++) {
        others += s->opts != own && s->opts != global_opts;
        n += s->opts != own && in_scope(s, scope) && takes(s, name, c);
      }
  }
  if (c == 0 && own == global_opts && n == others && !has_option(global_opts, name)) {
    append(buf, cap, w, "an option of every command but help");
    return;
  }
  append(buf, cap, w, "an option of ");
  for (int i = 0; option_sets[i] != NULL; i++)
    for (const dspk__sub_optset *s = option_sets[i]; s->who != NULL; s++)
      if (s->opts != own && in_scope(s, scope) && takes(s, name, c))
        append(buf, cap, w, "%s%s", k++ == 0 ? "" : k == n ? " and " : ", ", s->who);
}

/* Whether opt, of set, is the first option of its name in the lists: one
 * that several commands take is named once. */
static bool first_named(const dspk__sub_optset *set, const struct option *opt) {
  for (int i = 0; option_sets[i] != NULL; i++)
    for (const dspk__sub_optset *s = option_sets[i]; s->who != NULL; s++)
      for (const struct option *o = s->opts; o->name != NULL; o++) {
        if (s == set && o == opt)
          return true;
        if (strcmp(o->name, opt->name) == 0)
          return false;
      }
  return true;
}

/* The long options of other commands that tok[2..len) names (those named
 * exactly, when there are; else those it abbreviates) and that own does
 * not take, as "--inverse: an option of fft; --interval: an option of top"
 * into buf; returns how many. */
static int foreign_long(const struct option *own, const char *scope, const char *tok,
                        size_t len, char *buf, size_t cap) {
  size_t w = 0;
  int n = 0;
  bool exact = false;
  buf[0] = '\0';
  for (int pass = 0; pass < 2 && n == 0; pass++) {
    exact = pass == 0;
    for (int i = 0; option_sets[i] != NULL; i++)
      for (const dspk__sub_optset *s = option_sets[i]; s->who != NULL; s++)
        for (const struct option *o = s->opts; o->name != NULL; o++) {
          if (strncmp(o->name, tok + 2, len - 2) != 0 || (exact && o->name[len - 2]) ||
              has_option(own, o->name) || !first_named(s, o))
            continue;
          append(buf, cap, &w, "%s--%s: ", n++ ? "; " : "", o->name);
          owners(own, scope, o->name, 0, buf, cap, &w);
        }
  }
  return n;
}

/* The options of other commands that the letter c stands for, in the
 * long options' style, each named once: "--size, an option of ping;
 * --shared, an option of kernel" into buf; returns how many. */
static int foreign_short(const struct option *own, const char *scope, int c, char *buf,
                         size_t cap) {
  size_t w = 0;
  int n = 0;
  buf[0] = '\0';
  for (int i = 0; option_sets[i] != NULL; i++)
    for (const dspk__sub_optset *s = option_sets[i]; s->who != NULL; s++) {
      const struct option *o = s->opts != own ? short_option(s, c) : NULL;
      bool named = false;
      for (int j = 0; o != NULL && j <= i && !named; j++)
        for (const dspk__sub_optset *t = option_sets[j]; t->who != NULL && t != s; t++)
          named = named || (t->opts != own && takes(t, o->name, c));
      if (o == NULL || named)
        continue;
      append(buf, cap, &w, "%s--%s, ", n++ ? "; " : "", o->name);
      owners(own, scope, o->name, c, buf, cap, &w);
    }
  return n;
}

/* The command (and subcommand) an option is given to, for messages. */
static const char *option_owner(const dspk__sub_ctx *ctx, char *buf, size_t cap) {
  if (ctx == NULL || ctx->cmd == NULL)
    return GLOBAL_WHO;
  if (ctx->sub == NULL)
    return ctx->cmd;
  snprintf(buf, cap, "%s %s", ctx->cmd, ctx->sub);
  return buf;
}

int dspk__sub_bad_option(const dspk__sub_ctx *ctx, char **argv, const struct option *opts) {
  /* An array operand is a command's: before COMMAND "-:x" is an option. */
  const char *tok, *member = ctx != NULL && ctx->cmd != NULL ? stdin_member(argv) : NULL;
  /* Before a subcommand, that command's subcommands own an option first. */
  const char *scope = ctx != NULL && ctx->cmd != NULL && ctx->sub != NULL &&
                              strcmp(ctx->sub, BEFORE_SUB) == 0
                          ? ctx->cmd
                          : NULL;
  char cands[1024], who[64];
  if (member != NULL)
    return dspk__sub_usage(ctx, "'%s': standard input cannot name an .npz member ('-' is "
                           "one .npy on standard input): save the archive as a file and "
                           "give FILE.npz:NAME", dspk__sub_arg(member));
  if (long_token(argv, &tok)) {
    int len = (int)strcspn(tok, "=");
    /* A prefix of several names in the table, or a name not there. */
    if (optopt == 0 && abbreviated(opts, tok, (size_t)len, cands, sizeof cands) > 1)
      return dspk__sub_usage(ctx, "option '%s' is ambiguous: %s", dspk__sub_arg_n(tok, len),
                             cands);
    if (optopt == 0 && foreign_long(opts, scope, tok, (size_t)len, cands, sizeof cands) > 0)
      return dspk__sub_usage(ctx, "option '%s' does not apply to %s (%s)",
                             dspk__sub_arg_n(tok, len), option_owner(ctx, who, sizeof who),
                             cands);
    if (optopt == 0)
      return dspk__sub_usage(ctx, "unknown option '%s'", dspk__sub_arg_n(tok, len));
    /* A known flag given a value: getopt_long refuses it with its code.
     * (Any other nonzero optopt is a short option inside a word that
     * follows the long one: "-xj" leaves optind on it.) */
    if (tok[len] == '=')
      return dspk__sub_usage(ctx, "option '%.*s' takes no value (give it alone: '%.*s')",
                             len, tok, len, tok);
  }
  if (optopt > 0 && optopt < 128 && optopt != '?' &&
      foreign_short(opts, scope, optopt, cands, sizeof cands) > 0)
    return dspk__sub_usage(ctx, "option '-%c' does not apply to %s (-%c: %s)", optopt,
                           option_owner(ctx, who, sizeof who), optopt, cands);
  if (optopt > 0 && optopt < 128 && optopt != '?')
    return dspk__sub_usage(ctx, "unknown option '-%s'", dspk__sub_arg((char[]){(char)optopt, 0}));
  if (optopt < 0 || (optopt >= 128 && optopt < 256)) { /* a byte outside ASCII (char signed or not) */
    char opt[8];
    return dspk__sub_usage(ctx, "unknown option '%s'",
                           dspk__sub_arg(non_ascii_short(argv, (unsigned char)optopt, opt)));
  }
  return dspk__sub_usage(ctx, "unknown option '%s'", dspk__sub_arg(tok));
}

int dspk__sub_before_subcommand(dspk__sub_ctx *ctx, int argc, char **argv) {
  static const struct option none[] = {{NULL, 0, NULL, 0}};
  if (argc < 2 || argv[1][0] != '-' || argv[1][1] == '\0' || strcmp(argv[1], "--") == 0)
    return -1;
  ctx->sub = BEFORE_SUB;
  optind = 0; /* the command's words, argv[0] the command's name */
  (void)getopt_long(argc, argv, "+:", none, NULL); /* '?': none is known */
  return dspk__sub_bad_option(ctx, argv, none);
}

int dspk__sub_opt_other(dspk__sub_ctx *ctx, int opt, char **argv,
                        const struct option *opts) {
  if (opt == 'h')
    return dspk__sub_help(ctx);
  if (opt == ':')
    return dspk__sub_missing_arg(ctx, argv);
  return dspk__sub_bad_option(ctx, argv, opts);
}

int dspk__sub_json_only(dspk__sub_ctx *ctx, int argc, char **argv, bool *json) {
  const struct option *opts = json_only_opts;
  int opt;

  while ((opt = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    if (opt != 'j')
      return dspk__sub_opt_other(ctx, opt, argv, opts);
    *json = true;
  }
  return dspk__sub_end_args(ctx, argc, argv) ? DSPK__SUB_EXIT_USAGE : -1;
}

int dspk__sub_json_connect(dspk__sub_ctx *ctx, int argc, char **argv, bool *json) {
  int rc = dspk__sub_json_only(ctx, argc, argv, json);
  if (rc >= 0)
    return rc;
  rc = dspk__sub_check_std(ctx, true, NULL, 0, NULL, 0);
  if (rc == 0)
    rc = dspk__sub_connect(ctx);
  return rc != 0 ? rc : -1;
}

int dspk__sub_end_args(const dspk__sub_ctx *ctx, int argc, char **argv) {
  if (optind < argc)
    return dspk__sub_usage(ctx, "unexpected argument '%s'", argv[optind]);
  return 0;
}

int dspk__sub_missing_arg(const dspk__sub_ctx *ctx, char **argv) {
  const char *tok;
  if (!long_token(argv, &tok) && optopt > 0 && optopt < 128)
    return dspk__sub_usage(ctx, "option '-%c' needs an argument", optopt);
  return dspk__sub_usage(ctx, "option '%s' needs an argument", tok);
}

double dspk__sub_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int dspk__sub_split(const char *s, const char *seps, char *buf, size_t cap,
                    char **items, int max) {
  int n = 0;
  char *p;
  if (strlen(s) >= cap)
    return -1;
  strcpy(buf, s);
  p = buf;
  for (;;) {
    char *item = strsep(&p, seps);
    if (*item == '\0' || n == max)
      return -1;
    items[n++] = item;
    if (!p)
      return n;
  }
}

int dspk__sub_once(const dspk__sub_ctx *ctx, bool *seen, int opt, char **argv) {
  /* The option as typed: the argument before a separate optarg, else the
   * one getopt_long just read; "--name" without its "=value", "-x" alone. */
  const char *tok = optind >= 2 && optarg == argv[optind - 1] ? argv[optind - 2]
                                                               : argv[optind - 1];
  if (!*seen) {
    *seen = true;
    return 0;
  }
  if (strncmp(tok, "--", 2) == 0)
    return dspk__sub_usage(ctx, "option '%.*s' given twice (it takes one value)",
                           (int)strcspn(tok, "="), tok);
  return dspk__sub_usage(ctx, "option '-%c' given twice (it takes one value)",
                         opt > 0 && opt < 128 ? opt : tok[1]);
}
/* Whether the kernel gives transparent huge pages to memory that asks for
 * them ("always" or "madvise" in sysfs). */
static bool thp_available(void) {
  char buf[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == NULL)
    return false;
  if (fgets(buf, sizeof buf, f) == NULL)
    buf[0] = '\0';
  fclose(f);
  return strstr(buf, "[always]") != NULL || strstr(buf, "[madvise]") != NULL;
}

/* dspk-submit's large blocks (the receive buffer a result streams into,
 * the result itself) are fresh memory touched once, and each 4 KiB page of
 * it costs a page fault: about 2150 faults, half the process's CPU time,
 * for a 4 MiB result (measured with perf stat on the build host).  Where
 * the kernel offers transparent huge pages, large blocks come from the
 * heap instead of one mapping each, and a heap reserve is marked for huge
 * pages, so touching it faults 2 MiB at a time (130 to 520 faults, CPU
 * time 8.6 -> 5-7 ms there).  The reserve is address space until touched;
 * nothing here can fail the command. */
static void heap_setup(void) {
  enum { RESERVE = 64 << 20 };
  long pg = sysconf(_SC_PAGESIZE);
  char *p;
  if (pg <= 0 || !thp_available())
    return;
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  p = malloc(RESERVE);
  if (p != NULL) {
    uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    madvise((void *)a, RESERVE - (size_t)(a - (uintptr_t)p) - (size_t)pg, MADV_HUGEPAGE);
  }
  free(p);
}

/* Standard streams that were closed when the command started are opened
 * on /dev/null the wrong way round (stdin for writing, stdout and stderr
 * for reading): the socket and files then never get descriptors 0-2, where
 * a result or a message would land in them, and using a closed stream
 * still fails (EBADF) as it would have; a path naming one, "-" included,
 * is a descriptor that is not open (ENOENT, outfile.h). */
static void guard_std_fds(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
      continue;
    dspk__std_mark_closed(fd); /* a path naming it is then not open */
    int n = open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
    if (n >= 0 && n != fd) { /* a lower one was closed too: taken above */
      dup2(n, fd);
      close(n);
    }
  }
}

static int std_not_open(const dspk__sub_ctx *ctx, int fd) {
  return dspk__sub_fail(ctx, DSPK_ENOENT, "%s: descriptor %d is not open", dspk__std_name(fd),
                        fd);
}

int dspk__sub_check_std(const dspk__sub_ctx *ctx, bool writes_stdout, char *const *inputs,
                        int ninputs, const char *const *outputs, int noutputs) {
  for (int i = 0; i < ninputs; i++) {
    int fd = dspk__fd_alias(inputs[i]);
    if (dspk__std_closed(fd))
      return std_not_open(ctx, fd);
  }
  for (int i = 0; i < noutputs; i++) {
    int fd = outputs[i] == NULL             ? -1
             : strcmp(outputs[i], "-") == 0 ? STDOUT_FILENO
                                            : dspk__fd_alias(outputs[i]);
    if (dspk__std_closed(fd))
      return std_not_open(ctx, fd);
  }
  if (writes_stdout && dspk__std_closed(STDOUT_FILENO))
    return std_not_open(ctx, STDOUT_FILENO);
  return 0;
}

int dspk__sub_json_written(const dspk__sub_ctx *ctx, FILE *f) {
  if (f != stderr || (fflush(f) == 0 && !ferror(f)))
    return DSPK__SUB_EXIT_OK;
  int e = errno;
  clearerr(f);
  return dspk__sub_fail(ctx, DSPK_EIO, "<stderr>: %s", strerror(e ? e : EIO));
}

/* Whatever stdout still holds in its buffer is written now: a write that
 * fails there (a full disk) fails the command.  One that fails because
 * standard output was closed at the start (a command that printed without
 * dspk__sub_check_std first: help, --version, --list-options) is told as
 * that check tells it. */
static int flush_stdout(const dspk__sub_ctx *ctx, int rc) {
  if (fflush(stdout) == 0 && !ferror(stdout))
    return rc;
  int e = errno;
  if (rc != DSPK__SUB_EXIT_OK)
    return rc; /* its own failure is already told */
  if (dspk__std_closed(STDOUT_FILENO))
    return std_not_open(ctx, STDOUT_FILENO);
  return dspk__sub_fail(ctx, DSPK_EIO, "<stdout>: %s", strerror(e ? e : EIO));
}

/* "--list-options [COMMAND [SUBCOMMAND]]" (args[0] is "--list-options"),
 * for the bash completion: the options that the command line so far takes
 * there, from the tables getopt_long parses it with, one a line, "--LONG
 * -S value" ("-" for no short letter, "flag" for an option without a
 * value, "values" for the one that may be given more than once, the
 * table's repeats).  Before COMMAND, dspk-submit's own; after help, or a
 * command that has subcommands before its SUBCOMMAND, --help alone.  For
 * a command whose first operand decides an option (map FN: the table's
 * per_operand), the operand may follow as SUBCOMMAND: the option is left
 * out after one that does not take it.  An unknown command line prints
 * nothing and is exit 2. */
static int list_options(int n, char **args) {
  static const struct option help_only[] = {{"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
  static const dspk__sub_optset help_set = {"help", ":h", help_only, NULL, NULL, NULL};
  const dspk__sub_optset *set = n < 2 ? &global_optsets[0] : NULL;
  dspk__sub_ctx ctx = {NULL, NULL, NULL, NULL, 0, NULL};
  char who[128];
  if (n > 3)
    return DSPK__SUB_EXIT_USAGE;
  snprintf(who, sizeof who, "%s%s%s", n > 1 ? args[1] : "", n > 2 ? " " : "",
           n > 2 ? args[2] : "");
  if (n >= 2 && strcmp(args[1], "help") == 0) /* before COMMAND or after it */
    set = &help_set;
  /* "map FN": map's own options, less those FN does not take. */
  const char *operand = NULL;
  for (int i = 0; n == 3 && set == NULL && option_sets[i] != NULL; i++)
    for (const dspk__sub_optset *s = option_sets[i]; s->who != NULL && set == NULL; s++)
      if (s->per_operand != NULL && strcmp(s->who, args[1]) == 0)
        set = s, operand = args[2];
  for (int i = 0; n >= 2 && set == NULL && option_sets[i] != NULL; i++)
    for (const dspk__sub_optset *s = option_sets[i]; s->who != NULL && set == NULL; s++) {
      if (strcmp(s->who, who) == 0 && s != &global_optsets[0])
        set = s;
      else if (n == 2 && in_scope(s, args[1])) /* before SUBCOMMAND */
        set = &help_set;
    }
  if (set == NULL)
    return DSPK__SUB_EXIT_USAGE;
  for (const struct option *o = set->opts; o->name != NULL; o++) {
    const char *kind = o->has_arg != required_argument                       ? "flag"
                       : set->repeats != NULL && strcmp(set->repeats, o->name) == 0 ? "values"
                                                                               : "value";
    if (operand != NULL && strcmp(o->name, set->per_operand) == 0) {
      char word[64];
      snprintf(word, sizeof word, " %s ", operand);
      if (strstr(set->operands, word) == NULL)
        continue;
    }
    if (o->val > 0 && o->val < 128 && short_option(set, o->val) == o)
      printf("--%s -%c %s\n", o->name, o->val, kind);
    else
      printf("--%s - %s\n", o->name, kind);
  }
  return flush_stdout(&ctx, DSPK__SUB_EXIT_OK);
}

/* "help [COMMAND]": args[0] is "help".  Its words are read in order, as a
 * command's options are, the first that decides winning: -h/--help (help's
 * own, which may repeat and be abbreviated or clustered, "-hh") lists the
 * commands; any other option is one help does not take ("does not apply to
 * help", or a flag given a value), after COMMAND too; the first other word
 * ("-" and "--" included) is COMMAND and a second one is an extra word.
 * Each word is parsed alone (help takes no option with a value), so that
 * an option after COMMAND is judged as one before it. */
static int help_command(dspk__sub_ctx *ctx, int n, char **args) {
  static const struct option help_opts[] = {{"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
  const char *name = NULL;
  int opt, rc;
  for (int i = 1; i < n; i++) {
    char *word[] = {args[0], args[i], NULL};
    ctx->cmd = "help";
    if (args[i][0] != '-' || args[i][1] == '\0' || strcmp(args[i], "--") == 0) {
      if (name != NULL)
        return dspk__sub_usage(ctx, "takes one COMMAND at most, got extra argument '%s'",
                               dspk__sub_arg(args[i]));
      name = args[i];
      /* COMMAND here is help's operand: the line says "help: " as help's
       * other errors do (probe 21 D-5), and points at the list. */
      if (strcmp(name, "help") != 0 && find_cmd(name) == NULL) {
        dspk__sub_fail(ctx, DSPK_EINVAL, "unknown command '%s' (see '" PROG " --help')",
                       dspk__sub_arg(name));
        return DSPK__SUB_EXIT_USAGE;
      }
      continue;
    }
    optind = 0; /* word[0] stands for argv[0] */
    while ((opt = getopt_long(2, word, "+:h", help_opts, NULL)) != -1) {
      if (opt != 'h')
        return dspk__sub_bad_option(ctx, word, help_opts);
      name = "help"; /* help's own help: the commands */
      goto out;
    }
  }
out:
  /* help's own help (--help, or "help help") is the program's, as for a
   * bare "help": help is a command, but not one of the table's. */
  ctx->cmd = name == NULL || strcmp(name, "help") == 0 ? "" : name;
  rc = dspk__sub_help(ctx);
  ctx->cmd = "help";
  return flush_stdout(ctx, rc);
}

int main(int argc, char **argv) {
  const struct option *opts = global_opts;
  dspk__sub_ctx ctx = {NULL, NULL, NULL, NULL, 0, NULL};
  const dspk__sub_cmd *cmd;
  bool seen_socket = false;
  int opt, rc, ci;

  guard_std_fds();
  /* Past a file size limit (ulimit -f), a write fails (EFBIG) and the
   * command says so and removes the partial output, rather than dying. */
  signal(SIGXFSZ, SIG_IGN);
  heap_setup();
  opterr = 0;
  if (argc >= 2 && strcmp(argv[1], "--list-options") == 0)
    return list_options(argc - 1, argv + 1);
  /* '+': stop at the command name; its options are its own. */
  while ((opt = getopt_long(argc, argv, global_optsets[0].shorts, opts, NULL)) != -1) {
    switch (opt) {
    case 'S':
      if ((rc = dspk__sub_once(&ctx, &seen_socket, opt, argv)) != 0)
        return rc;
      ctx.socket = optarg;
      break;
    case 'h':
      print_prog_help(stdout);
      return flush_stdout(&ctx, DSPK__SUB_EXIT_OK);
    case 'V':
      printf(PROG " %s\n", dspk_version());
      return flush_stdout(&ctx, DSPK__SUB_EXIT_OK);
    case ':':
      return dspk__sub_missing_arg(&ctx, argv);
    default:
      return dspk__sub_bad_option(&ctx, argv, opts);
    }
  }
  if (optind >= argc)
    return dspk__sub_usage(&ctx, "missing COMMAND");
  /* A --socket value that names no socket whatever the system holds is a
   * bad command line, as the other malformed global options are: empty,
   * or a lone '@' (an abstract name with nothing after it).  A lone '@'
   * in $DSPK_SOCKET stays the library's refusal at connect (exit 1). */
  if (ctx.socket != NULL && ctx.socket[0] == '\0')
    return dspk__sub_usage(&ctx, "empty --socket path");
  if (ctx.socket != NULL && strcmp(ctx.socket, "@") == 0)
    return dspk__sub_usage(&ctx, "--socket '@': abstract socket name after '@' is empty "
                                 "(@NAME names an abstract socket)");
  if (strcmp(argv[optind], "help") == 0)
    return help_command(&ctx, argc - optind, argv + optind);
  cmd = find_cmd(argv[optind]);
  if (cmd == NULL)
    return dspk__sub_usage(&ctx, "unknown command '%s'", dspk__sub_arg(argv[optind]));
  ctx.cmd = cmd->name;
  /* COMMAND --help prints the help whatever the environment holds, as
   * "help COMMAND" does: the environment is checked for the commands that
   * run. */
  if (!asks_help(argc - optind, argv + optind) && (rc = check_size_env(&ctx)) != 0)
    return rc;
  ci = optind;
  /* Each command parses its own arguments with getopt_long from scratch:
   * optind 0 makes glibc reinitialize, and it starts at argv[1], so the
   * command name stands in for argv[0]. */
  optind = 0;
  rc = cmd->run(&ctx, argc - ci, argv + ci);
  dspk_close(ctx.client);
  return flush_stdout(&ctx, rc);
}
