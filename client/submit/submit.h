/*
 * Internal interface between the source files of dspk-submit.
 *
 * main.c parses the global options, finds the command in the table below
 * and runs it; each command lives in a file by theme (info.c: ping, devices,
 * status; ops.c: the compute ops; kernel.c: raw kernels; cache.c: the
 * daemon's cache).  Every command
 * receives its own argc/argv (argv[0] is the command name) and returns the
 * process exit status.  Errors are reported through dspk__sub_fail() and
 * friends, which print exactly one line on stderr:
 *     dspk-submit: COMMAND: ENAME: detail
 */
#ifndef DSPK_CLIENT_SUBMIT_SUBMIT_H
#define DSPK_CLIENT_SUBMIT_SUBMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "client/submit/escape.h"
#include "client/submit/outfile.h"
#include "dspk/dspk.h"
#include "proto/units.h"

/* Exit statuses (documented in docs/cli.md). */
#define DSPK__SUB_EXIT_OK 0
#define DSPK__SUB_EXIT_FAIL 1  /* the operation failed (daemon, file, ...) */
#define DSPK__SUB_EXIT_USAGE 2 /* bad command line */

typedef struct dspk__sub_ctx {
  const char *socket; /* --socket, or NULL for $DSPK_SOCKET / the default */
  const char *cmd;    /* name of the running command, for messages */
  dspk_client *client;
  /* The command's input files in the order of the task's inputs (NULL when
   * none): the daemon's "input N" is named as the file in its errors. */
  char *const *inputs;
  int ninputs;
  const char *sub;    /* the subcommand running ("clear" of cache), or NULL */
} dspk__sub_ctx;

typedef struct dspk__sub_cmd {
  const char *name;
  int (*run)(dspk__sub_ctx *ctx, int argc, char **argv);
  const char *summary; /* one line for the command list */
  const char *help;    /* full --help text, starting with the usage line */
} dspk__sub_cmd;

/* Command handlers (info.c, ops.c). */
int dspk__sub_ping(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_devices(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_status(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_gemm(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_fft(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_fir(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_contract(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_reduce(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_map(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_kernel(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_cache(dspk__sub_ctx *ctx, int argc, char **argv);
/* metrics.c, top.c, trace.c: watching the daemon. */
int dspk__sub_metrics(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_top(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_trace(dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_job(dspk__sub_ctx *ctx, int argc, char **argv);

/* Prints the one-line summary of an output tensor t of res (ops.c) on f:
 *   f64 (3, 4) on cpu:0, 35 us: [1, 2.5, ...] (12 values)
 * or, when saved is not NULL (the file t was written to, "-" for stdout),
 *   f64 (3, 4) on cpu:0, 35 us: wrote out.npy
 * The time is left out when the daemon sent none. */
void dspk__sub_print_summary(FILE *f, const dspk_result *res,
                             const dspk_tensor *t, const char *saved);

/* Prints res as one line of JSON on f (ops.c):
 *   {"device":"cpu:0","time_us":35,"outputs":[{"dtype":"f64",
 *    "shape":[3,4],"count":12,"head":[1,2.5,...]}]}
 * saved (NULL, or one entry per output, NULL where not saved) gives the
 * files outputs were written to: those have "file" instead of "head"
 * (the first values, at most 8; complex ones as [re, im]). */
void dspk__sub_json_result(FILE *f, const dspk_result *res,
                           const char *const *saved);

/* "35 us", "12.3 ms", "4.56 s" into buf; returns buf. */
const char *dspk__sub_fmt_time(uint64_t us, char *buf, size_t cap);

/* An output path that is a directory: reported as a bad command line
 * ("-o PATH: is a directory", docs/cli.md ARRAYS) and DSPK__SUB_EXIT_USAGE's
 * status returned; else 0.  Every command with -o asks before it opens. */
int dspk__sub_output_dir(const dspk__sub_ctx *ctx, const char *path);

/* Opens the output path ("-": standard output) into *of before the task
 * runs (ops.c), so that an output that cannot be created fails before any
 * work is done, with the codes of outfile.h.  Returns 0, or reports the
 * failure and returns DSPK__SUB_EXIT_FAIL.  The caller passes *of to
 * dspk__sub_save, or to dspk__outfile_abort when it gives up. */
int dspk__sub_open_output(const dspk__sub_ctx *ctx, const char *path,
                          dspk__outfile *of);

/* Writes tensor o as .npy to of (opened by dspk__sub_open_output for path)
 * and completes it: the file replaced, or left as it was on failure (ops.c).
 * 0, or a negative dspk code with a message naming path (<stdout> for "-")
 * in err; of is closed either way. */
int dspk__sub_save(const dspk_tensor *o, dspk__outfile *of, const char *path,
                   char *err, size_t errlen);

/* Checks the input file names: none empty, no "FILE.npz:" with an empty
 * array name, at most one "-" (standard input), and stdin not a terminal
 * when one is; otherwise reports a usage error and returns -1 (the caller
 * exits with DSPK__SUB_EXIT_USAGE).  kernel's files[0] is its SOURCE, a
 * text file, never an .npz member. */
int dspk__sub_check_inputs(const dspk__sub_ctx *ctx, char *const *files,
                         int nfiles);

/* The command table (main.c), terminated by a NULL name. */
extern const dspk__sub_cmd dspk__sub_cmds[];

/* Prints "dspk-submit: CMD: ENAME: detail" (one line; newlines in the
 * detail become "; ") and returns DSPK__SUB_EXIT_FAIL. */
int dspk__sub_fail(const dspk__sub_ctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like dspk__sub_fail for a command-line mistake: adds a hint to run
 * --help and returns DSPK__SUB_EXIT_USAGE. */
int dspk__sub_usage(const dspk__sub_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Reports a failed library call on ctx->client: the daemon's (or the
 * library's) detail from dspk_last_error(), else dspk_strerror(code), with
 * the wire protocol's names of what is at fault ("options.alpha",
 * "options.axes[0]", "input 1") said as the command line says them
 * ("--alpha", "--axis", the file).  Returns DSPK__SUB_EXIT_FAIL. */
int dspk__sub_fail_client(const dspk__sub_ctx *ctx, int code);

/* A failed library call that read the input files npy[0..n) (with i >= 0:
 * a call for input i only), reported as dspk__sub_fail_client does, but a
 * mapped input whose file is now shorter than what was mapped of it is
 * named first ("PATH: the file changed while in use (...)": the library's
 * EIO knows only a descriptor or "an input file"), and a call for input i
 * that failed with EIO or EPERM names files[i].  Returns
 * DSPK__SUB_EXIT_FAIL. */
struct dspk__npy;
int dspk__sub_fail_inputs(const dspk__sub_ctx *ctx, int rc, const struct dspk__npy *npy,
                          char **files, int n, int i);

/* dspk__sub_fail_client with what the failure is about said first (a file:
 * "PATH: the file changed while in use (...): DETAIL"); prefix NULL or "":
 * dspk__sub_fail_client itself. */
int dspk__sub_fail_client_at(const dspk__sub_ctx *ctx, int code, const char *prefix);

/* The one check of standard descriptors closed when the command started
 * (main.c holds their numbers on /dev/null, outfile.h), made by every
 * command once its command line is read and before it reads an input or
 * reaches the daemon, so that nothing is done only to be thrown away (a
 * ping's round trip, a task): an input that names one ("-", /dev/stdin,
 * /dev/fd/N, /proc/self/fd/N; inputs[0..ninputs), the kernel's SOURCE
 * included), then an output that names one ("-" is standard output;
 * outputs[0..noutputs), NULL entries skipped), then standard output when
 * writes_stdout (the command prints its result there, or a .npy, a
 * trace).  Returns 0, or reports "<stdin>: descriptor 0 is not open"
 * (<stdout>, <stderr>: dspk__std_name) as DSPK_ENOENT and returns
 * DSPK__SUB_EXIT_FAIL (docs/cli.md, EXIT STATUS). */
/* After a command's --json result was written to f: when f is standard
 * error (the result went there because -o - took standard output), a
 * write that failed there (a full device, a standard error closed at the
 * start) fails the command as one to standard output does, EIO
 * "<stderr>: ..." and DSPK__SUB_EXIT_FAIL (docs/cli.md, EXIT STATUS;
 * probe 21 D-4: it was exit 0, the result lost in silence).  Standard
 * output is checked once, at the end (main.c).  Returns
 * DSPK__SUB_EXIT_OK otherwise. */
int dspk__sub_json_written(const dspk__sub_ctx *ctx, FILE *f);

int dspk__sub_check_std(const dspk__sub_ctx *ctx, bool writes_stdout, char *const *inputs,
                        int ninputs, const char *const *outputs, int noutputs);

/* Connects ctx->client if not yet connected.  Returns 0, or reports the
 * failure and returns DSPK__SUB_EXIT_FAIL. */
int dspk__sub_connect(dspk__sub_ctx *ctx);

/* Prints the --help text of the command named ctx->cmd on stdout; returns
 * DSPK__SUB_EXIT_OK. */
int dspk__sub_help(const dspk__sub_ctx *ctx);

/* The end of every command's getopt_long table: --json ('j'), --help ('h')
 * and the terminator. */
#define DSPK__SUB_OPTS_END                                                     \
  {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'},          \
      {NULL, 0, NULL, 0}
/* The last cases of every command's getopt switch: -j/--json sets the bool
 * json; anything else not handled above (-h/--help, a missing argument, an
 * unknown option) ends the command through dspk__sub_opt_other (opts: the
 * getopt_long table). */
#define DSPK__SUB_OPT_CASES(ctx, opt, argv, json, opts)                        \
  case 'j':                                                                    \
    (json) = true;                                                             \
    break;                                                                     \
  default:                                                                     \
    return dspk__sub_opt_other((ctx), (opt), (argv), (opts))

/* The options of one command (or subcommand) as its getopt_long call takes
 * them.  Every command's are listed (main.c), so that an option of another
 * command, whole or abbreviated, is said to be one: "option '--grid' does
 * not apply to gemm (--grid: an option of kernel)" (docs/cli.md). */
struct option;
typedef struct dspk__sub_optset {
  const char *who;           /* "kernel", "cache clear"; NULL ends a list */
  const char *shorts;        /* getopt_long's optstring (":e:g:h") */
  const struct option *opts; /* ends with DSPK__SUB_OPTS_END */
  /* The option taking a value that may be given more than once, its
   * values adding up (reduce's axis, kernel's output); every other one
   * given twice is a bad command line (dspk__sub_once).  NULL: none. */
  const char *repeats;
  /* An option that only some first operands take (map's alpha), and
   * those operands, each between blanks (" scale axpy "); NULL: none.
   * The parser refuses it with another operand; --list-options leaves it
   * out after another one. */
  const char *per_operand, *operands;
} dspk__sub_optset;
/* Each file's commands' option sets, NULL-who terminated. */
extern const dspk__sub_optset dspk__sub_info_optsets[], dspk__sub_op_optsets[],
    dspk__sub_kernel_optsets[], dspk__sub_cache_optsets[], dspk__sub_top_optsets[],
    dspk__sub_trace_optsets[], dspk__sub_job_optsets[];

/* Usage errors for getopt_long's '?' and ':' returns (argv and opts as
 * passed to getopt_long: an abbreviation of several long options is said
 * to be ambiguous, with them; one of another command's options, whole or
 * abbreviated, not to apply, with the commands it belongs to); return
 * DSPK__SUB_EXIT_USAGE. */
int dspk__sub_bad_option(const dspk__sub_ctx *ctx, char **argv, const struct option *opts);
/* For a command of subcommands (cache, job): an option given before the
 * SUBCOMMAND (argv[1]), refused as dspk__sub_bad_option refuses one of
 * another command, "option '--kernels' does not apply to cache before
 * SUBCOMMAND (--kernels: an option of cache clear)"; returns the exit
 * status, or -1 when argv[1] is no option. */
int dspk__sub_before_subcommand(dspk__sub_ctx *ctx, int argc, char **argv);
/* What every command's getopt loop does with -h/--help (its help), a
 * missing option argument and an unknown option; returns the exit status. */
int dspk__sub_opt_other(dspk__sub_ctx *ctx, int opt, char **argv, const struct option *opts);
/* Parses the arguments of a command that takes only --json and --help:
 * returns -1 when the command should run (*json set), else its exit status. */
int dspk__sub_json_only(dspk__sub_ctx *ctx, int argc, char **argv, bool *json);
/* dspk__sub_json_only, then dspk__sub_connect: returns -1 when the command
 * should run (connected, *json set), else its exit status. */
int dspk__sub_json_connect(dspk__sub_ctx *ctx, int argc, char **argv, bool *json);
/* After a command's getopt loop: 0 when no argument is left, else the usage
 * error's exit status. */
int dspk__sub_end_args(const dspk__sub_ctx *ctx, int argc, char **argv);
int dspk__sub_missing_arg(const dspk__sub_ctx *ctx, char **argv);

/* For an option that takes one value (docs/cli.md: a repeated one is
 * refused, not overridden), called where the getopt loop handles opt:
 * returns 0 the first time (*seen becomes true), else reports the usage
 * error "option '--output' given twice" and returns its exit status.
 * Options that may repeat (reduce --axis, kernel -o) and flags do not call
 * it. */
int dspk__sub_once(const dspk__sub_ctx *ctx, bool *seen, int opt, char **argv);

/* Splits a list option's value s at any of the characters in seps into at
 * most max items, copied into buf (cap bytes) and pointed to by items.
 * Returns the number of items, or -1 when an item is empty ("0,", ",1",
 * "0,,1", ""), there are more than max, or s does not fit in buf. */
int dspk__sub_split(const char *s, const char *seps, char *buf, size_t cap,
                    char **items, int max);

/* Strict number parsing of a whole string: decimal digits with an optional
 * '-' (and for a double a fraction, an exponent, inf or nan); no blanks, no
 * '+', no hexadecimal.  0 on success, -1 otherwise.  A double is the
 * nearest one: a value too small for a normal double is a subnormal or 0
 * (1e-310, 1e-400: strtod's ERANGE on underflow is no error), one beyond
 * the largest double (1e400) is -2 (out of range) from parse_double. */
int dspk__sub_parse_double(const char *s, double *out);
int dspk__sub_parse_long(const char *s, long lo, long hi, long *out);

/* DSPK_SHARED_THRESHOLD for this command: the size it gives, else 0 (no
 * shared memory; main.c says why). */
size_t dspk__sub_shared_threshold(void);
/* A byte count with an optional binary unit (K, M, G, T, KiB, ...: 2M is
 * 2097152; proto/units.h, whose DSPK__SIZE_UNITS a refusal names) in
 * [lo, hi]: 0 on success, -1 otherwise. */
int dspk__sub_parse_size(const char *s, uint64_t lo, uint64_t hi,
                         uint64_t *out);

/* Monotonic time in microseconds. */
double dspk__sub_now_us(void);

#endif /* DSPK_CLIENT_SUBMIT_SUBMIT_H */
