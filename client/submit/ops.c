/*
 * dspk-submit's compute commands: gemm, fft, fir, contract, reduce and map.
 *
 * They all share one shape: parse options (one table, each command allowing
 * its own subset), read the positional .npy inputs with npy.c, fill a
 * dspk_task, run it with dspk_run() (a progress line is drawn on stderr
 * while the daemon autotunes, only when stderr is a terminal), and write
 * the first output to -o as .npy, or print a short summary (dtype, shape,
 * first values) when no -o is given.  Argument mistakes are found here,
 * before connecting; shape and dtype rules are the daemon's, whose message
 * (naming operand and axis) is passed on verbatim.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/submit/npy.h"
#include "client/submit/numfmt.h"
#include "client/submit/submit.h"
#include "proto/utf8.h"

/* Option ids beyond the printable short options. */
enum {
  OPT_OUTPUT = 'o',
  OPT_DEVICE = 'd',
  OPT_HELP = 'h',
  OPT_AXIS = 'a',
  OPT_TRANS_A = 1000,
  OPT_TRANS_B,
  OPT_ALPHA,
  OPT_BETA,
  OPT_INVERSE,
  OPT_JSON,
};

#define MAX_INPUTS 4

typedef struct op_args {
  const dspk__sub_optset *set; /* the command's options */
  const char *output;
  const char *device;
  int npos;
  char **pos;
  bool trans_a, trans_b, inverse, have_alpha, have_beta, json;
  double alpha, beta;
  unsigned naxes;
  int axes[DSPK_MAX_RANK];
} op_args;

static int add_axes(dspk__sub_ctx *ctx, op_args *a, const char *arg) {
  char buf[256], *items[DSPK_MAX_RANK + 1];
  int n = dspk__sub_split(arg, ",", buf, sizeof buf, items, DSPK_MAX_RANK + 1);
  if (n < 0)
    return dspk__sub_usage(ctx, "bad --axis '%s' (want K or K,K,... with no "
                                "empty item)", dspk__sub_arg(arg));
  for (int i = 0; i < n; i++) {
    long k;
    if (dspk__sub_parse_long(items[i], -DSPK_MAX_RANK, DSPK_MAX_RANK - 1, &k) < 0)
      return dspk__sub_usage(ctx, "bad --axis '%s' (want an axis, -%d..%d)",
                             dspk__sub_arg(items[i]), DSPK_MAX_RANK, DSPK_MAX_RANK - 1);
    if (a->naxes >= DSPK_MAX_RANK)
      return dspk__sub_usage(ctx, "more than %d axes", DSPK_MAX_RANK);
    a->axes[a->naxes++] = (int)k;
  }
  return 0;
}

/* The options of the op commands: -o, -d, --json and --help, and each
 * command's own. */
#define OP_COMMON_OPTS                                                         \
  {"output", required_argument, NULL, OPT_OUTPUT},                             \
      {"device", required_argument, NULL, OPT_DEVICE},                         \
      {"json", no_argument, NULL, OPT_JSON}, {"help", no_argument, NULL, OPT_HELP}
#define OP_SHORTS ":o:d:h"
static const struct option gemm_opts[] = {
    OP_COMMON_OPTS, {"trans-a", no_argument, NULL, OPT_TRANS_A},
    {"trans-b", no_argument, NULL, OPT_TRANS_B}, {"alpha", required_argument, NULL, OPT_ALPHA},
    {"beta", required_argument, NULL, OPT_BETA}, {NULL, 0, NULL, 0}};
static const struct option fft_opts[] = {
    OP_COMMON_OPTS, {"inverse", no_argument, NULL, OPT_INVERSE}, {NULL, 0, NULL, 0}};
static const struct option plain_opts[] = {OP_COMMON_OPTS, {NULL, 0, NULL, 0}};
static const struct option reduce_opts[] = {
    OP_COMMON_OPTS, {"axis", required_argument, NULL, OPT_AXIS}, {NULL, 0, NULL, 0}};
static const struct option map_opts[] = {
    OP_COMMON_OPTS, {"alpha", required_argument, NULL, OPT_ALPHA}, {NULL, 0, NULL, 0}};

enum { SET_GEMM, SET_FFT, SET_FIR, SET_CONTRACT, SET_REDUCE, SET_MAP };
const dspk__sub_optset dspk__sub_op_optsets[] = {
    [SET_GEMM] = {"gemm", OP_SHORTS, gemm_opts, NULL, NULL, NULL},
    [SET_FFT] = {"fft", OP_SHORTS, fft_opts, NULL, NULL, NULL},
    [SET_FIR] = {"fir", OP_SHORTS, plain_opts, NULL, NULL, NULL},
    [SET_CONTRACT] = {"contract", OP_SHORTS, plain_opts, NULL, NULL, NULL},
    [SET_REDUCE] = {"reduce", OP_SHORTS "a:", reduce_opts, .repeats = "axis"},
    [SET_MAP] = {"map", OP_SHORTS, map_opts, .per_operand = "alpha",
                 .operands = " scale axpy "},
    {NULL, NULL, NULL, NULL, NULL, NULL}};

/* Parses the options of an op command into *a (a->set set by the caller).
 * Returns -1 to go on, else an exit status (help or usage). */
static int parse_op_args(dspk__sub_ctx *ctx, int argc, char **argv,
                         op_args *a) {
  /* Only the command's own options are taken, and abbreviated ("gemm --a"
   * is --alpha: --axis is reduce's). */
  bool seen_output = false, seen_device = false, seen_alpha = false,
       seen_beta = false;
  int opt, rc;

  a->alpha = 1.0;
  while ((opt = getopt_long(argc, argv, a->set->shorts, a->set->opts, NULL)) != -1) {
    switch (opt) {
    case OPT_OUTPUT:
      if ((rc = dspk__sub_once(ctx, &seen_output, opt, argv)) != 0)
        return rc;
      a->output = optarg;
      break;
    case OPT_DEVICE:
      if ((rc = dspk__sub_once(ctx, &seen_device, opt, argv)) != 0)
        return rc;
      /* An empty ID would reach the library as its "any" (NULL or ""): a
       * typo such as --device "$DEV" with DEV unset must not run anywhere. */
      if (!*optarg)
        return dspk__sub_usage(ctx, "empty --device (want an ID that 'dspk-submit "
                                    "devices' lists, or any)");
      a->device = optarg;
      break;
    case OPT_HELP:
      return dspk__sub_help(ctx);
    case OPT_AXIS:
      rc = add_axes(ctx, a, optarg);
      if (rc != 0)
        return rc;
      break;
    case OPT_TRANS_A:
      a->trans_a = true;
      break;
    case OPT_TRANS_B:
      a->trans_b = true;
      break;
    case OPT_INVERSE:
      a->inverse = true;
      break;
    case OPT_JSON:
      a->json = true;
      break;
    case OPT_ALPHA:
      if ((rc = dspk__sub_once(ctx, &seen_alpha, opt, argv)) != 0)
        return rc;
      if ((rc = dspk__sub_parse_double(optarg, &a->alpha)) < 0)
        return dspk__sub_usage(ctx, "bad --alpha '%s' (%s)", dspk__sub_arg(optarg),
                               rc == -2 ? "beyond f64's range" : "want a number");
      a->have_alpha = true;
      break;
    case OPT_BETA:
      if ((rc = dspk__sub_once(ctx, &seen_beta, opt, argv)) != 0)
        return rc;
      if ((rc = dspk__sub_parse_double(optarg, &a->beta)) < 0)
        return dspk__sub_usage(ctx, "bad --beta '%s' (%s)", dspk__sub_arg(optarg),
                               rc == -2 ? "beyond f64's range" : "want a number");
      a->have_beta = true;
      break;
    case ':':
      return dspk__sub_missing_arg(ctx, argv);
    default:
      return dspk__sub_bad_option(ctx, argv, a->set->opts);
    }
  }
  a->pos = argv + optind;
  a->npos = argc - optind;
  if (a->output != NULL && a->output[0] == '\0')
    return dspk__sub_usage(ctx, "empty output file name");
  if (a->output != NULL && strcmp(a->output, "-") == 0 &&
      isatty(STDOUT_FILENO) == 1)
    return dspk__sub_usage(ctx, "-o -: standard output is a terminal; "
                                "redirect it to a file or a pipe");
  return -1;
}

/* Checks the number of positional arguments. */
static int want_pos(dspk__sub_ctx *ctx, const op_args *a, int lo, int hi,
                    const char *what) {
  if (a->npos < lo)
    return dspk__sub_usage(ctx, "missing %s", what);
  if (a->npos > hi)
    return dspk__sub_usage(ctx, "unexpected argument '%s'", a->pos[hi]);
  return -1;
}

/* ---- running a task and showing its result ------------------------------ */

typedef struct progress_state {
  bool tty;
  bool drawn;
  const char *cmd;
} progress_state;

static void on_progress(void *ud, uint32_t ticket, const char *what,
                        double fraction) {
  progress_state *p = ud;
  (void)ticket;
  if (!p->tty)
    return;
  if (fraction < 0)
    fraction = 0;
  if (fraction > 1)
    fraction = 1;
  fprintf(stderr, "\r\033[K%s: %s %3.0f%%", p->cmd, what ? dspk__sub_esc(what) : "working",
          fraction * 100.0);
  fflush(stderr);
  p->drawn = true;
}

/* IEEE binary16 to float, for printing f16 results. */
static float half_to_float(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0)
    v = ldexpf((float)m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = ldexpf((float)(m | 0x400), e - 25);
  return h & 0x8000 ? -v : v;
}

/* bfloat16 to float: its bits are a float's upper half. */
static float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* Element i of t as a double pair (imaginary part 0 for real dtypes). */
static void value_at(const dspk_tensor *t, uint64_t i, double *re, double *im) {
  const void *d = t->data;
  *im = 0;
  switch (t->dtype) {
  case DSPK_F32:
    *re = (double)((const float *)d)[i];
    break;
  case DSPK_F64:
    *re = ((const double *)d)[i];
    break;
  case DSPK_C64:
    *re = (double)((const float *)d)[2 * i];
    *im = (double)((const float *)d)[2 * i + 1];
    break;
  case DSPK_C128:
    *re = ((const double *)d)[2 * i];
    *im = ((const double *)d)[2 * i + 1];
    break;
  case DSPK_F16:
    *re = (double)half_to_float(((const uint16_t *)d)[i]);
    break;
  case DSPK_BF16:
    *re = (double)bf16_to_float(((const uint16_t *)d)[i]);
    break;
  default:
    *re = NAN;
    break;
  }
}

static void print_value(FILE *f, const dspk_tensor *t, uint64_t i) {
  double re, im;
  char a[40], b[40];
  value_at(t, i, &re, &im);
  /* A NaN prints as numpy prints it, "nan" whatever its sign bit (printf
   * writes "-nan"); --json writes null. */
  if (isnan(re))
    re = fabs(re);
  if (isnan(im))
    im = fabs(im);
  switch (t->dtype) {
  case DSPK_F32:
  case DSPK_F64:
  case DSPK_F16:
  case DSPK_BF16:
    dspk__sub_fmt_num(a, sizeof a, re, t->dtype, false);
    fputs(a, f);
    break;
  case DSPK_C64:
  case DSPK_C128:
    dspk__sub_fmt_num(a, sizeof a, re, t->dtype, false);
    dspk__sub_fmt_num(b, sizeof b, im, t->dtype, true);
    fprintf(f, "%s%sj", a, b);
    break;
  default:
    fprintf(f, "?");
    break;
  }
}

const char *dspk__sub_fmt_time(uint64_t us, char *buf, size_t cap) {
  if (us < 10000)
    snprintf(buf, cap, "%llu us", (unsigned long long)us);
  else if (us < 10000000)
    snprintf(buf, cap, "%.1f ms", (double)us / 1e3);
  else
    snprintf(buf, cap, "%.2f s", (double)us / 1e6);
  return buf;
}

/* Values shown by a summary (and the "head" of --json). */
#define SUMMARY_SHOW 8

void dspk__sub_print_summary(FILE *f, const dspk_result *res,
                             const dspk_tensor *t, const char *saved) {
  uint64_t n = dspk_tensor_numel(t);
  char tm[32];
  fprintf(f, "%s (", dspk_dtype_name(t->dtype));
  for (unsigned i = 0; i < t->rank; i++)
    fprintf(f, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  fprintf(f, "%s) on %s", t->rank == 1 ? "," : "", dspk__sub_esc(res->device));
  if (res->time_us > 0)
    fprintf(f, ", %s", dspk__sub_fmt_time(res->time_us, tm, sizeof tm));
  if (saved != NULL) {
    /* The name escaped as the error line's names are (escape.h): a
     * control character in it reaches no terminal. */
    fputs(": wrote ", f);
    if (strcmp(saved, "-") == 0)
      fputs("standard output", f);
    else
      dspk__sub_put(f, saved, DSPK__SUB_ESC_LINE);
    fputc('\n', f);
    return;
  }
  fputs(": [", f);
  for (uint64_t i = 0; i < n && i < SUMMARY_SHOW; i++) {
    if (i)
      fputs(", ", f);
    print_value(f, t, i);
  }
  fprintf(f, "%s] (%llu value%s)\n", n > SUMMARY_SHOW ? ", ..." : "",
          (unsigned long long)n, n == 1 ? "" : "s");
}

/* v as a JSON number in the same fewest digits as the text line (a
 * value of dtype dt, or of each part's for c64 and c128), and ".0" after
 * an integral one written without a point or exponent, as every float of
 * --json (cli.md, protocol.md's float rule): "3.0", and "-0.0", whose
 * sign a JSON reader would drop from "-0" (an integer); or null. */
static void json_num(FILE *f, double v, dspk_dtype dt) {
  char b[40];
  if (isfinite(v)) {
    dspk__sub_fmt_num(b, sizeof b, v, dt, false);
    const char *digits = b + (b[0] == '-');
    fputs(b, f);
    if (digits[strspn(digits, "0123456789")] == '\0')
      fputs(".0", f);
  } else {
    fputs("null", f);
  }
}

void dspk__sub_json_result(FILE *f, const dspk_result *res,
                           const char *const *saved) {
  fputs("{\"device\":", f);
  dspk__sub_json_str(f, res->device);
  fprintf(f, ",\"time_us\":%llu,\"outputs\":[", (unsigned long long)res->time_us);
  for (unsigned k = 0; k < res->nout; k++) {
    const dspk_tensor *t = &res->out[k];
    uint64_t n = dspk_tensor_numel(t);
    bool cplx = t->dtype == DSPK_C64 || t->dtype == DSPK_C128;
    fprintf(f, "%s{\"dtype\":\"%s\",\"shape\":[", k ? "," : "",
            dspk_dtype_name(t->dtype));
    for (unsigned i = 0; i < t->rank; i++)
      fprintf(f, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    fprintf(f, "],\"count\":%llu", (unsigned long long)n);
    if (saved != NULL && saved[k] != NULL) {
      fputs(",\"file\":", f);
      dspk__sub_json_str(f, saved[k]);
    } else if (!t->is_ref && t->data != NULL) {
      fputs(",\"head\":[", f);
      for (uint64_t i = 0; i < n && i < SUMMARY_SHOW; i++) {
        double re, im;
        value_at(t, i, &re, &im);
        fputs(i ? "," : "", f);
        if (cplx) {
          fputc('[', f);
          json_num(f, re, t->dtype);
          fputc(',', f);
          json_num(f, im, t->dtype);
          fputc(']', f);
        } else {
          json_num(f, re, t->dtype);
        }
      }
      fputc(']', f);
    }
    fputc('}', f);
  }
  fputs("]}\n", f);
}

/* Inline bytes above which inputs travel through daemon buffers, so that
 * the task.run request stays far below the daemon's max_message (256 MiB by
 * default); $DSPK_SUBMIT_INLINE_MAX overrides it (tests use a small one). */
#define INLINE_MAX_DEFAULT (64u << 20)
/* Inputs smaller than this stay inline even then (smaller ones too when
 * n of them could pass the inline limit: a daemon of a small max_message). */
#define INLINE_SMALL 4096
/* Bytes of a task.run request besides its inputs' data (keys, shapes,
 * options; the inputs below INLINE_SMALL that stay inline are counted). */
#define REQUEST_HEADROOM 65536

/* The inline limit: $DSPK_SUBMIT_INLINE_MAX or the default, and never more
 * than the daemon's own max_message allows (a daemon run with a smaller
 * --max-message refused a request of a few MiB with ELIMIT). */
static size_t inline_max(dspk_client *c) {
  const char *e = getenv("DSPK_SUBMIT_INLINE_MAX");
  size_t lim = INLINE_MAX_DEFAULT, mm = dspk_max_message(c);
  uint64_t v;
  if (e != NULL && dspk__sub_parse_size(e, 0, (uint64_t)1 << 40, &v) == 0)
    lim = (size_t)v;
  size_t room = mm > 2 * REQUEST_HEADROOM ? mm - REQUEST_HEADROOM : mm / 2;
  if (mm && lim > room)
    lim = room;
  return lim;
}

/* When the inputs together exceed inline_max(), uploads every input of at
 * least INLINE_SMALL bytes (at least inline_max() / n, when that is less,
 * so that those left inline fit together) into a daemon buffer (buffer.create on the
 * task's device, or "any"; buffer.write splits big data) and turns its
 * tensor into a reference.  The buffers belong to the connection and go
 * with it.  Returns 0 or the exit status of a reported failure. */
/* See submit.h. */
int dspk__sub_fail_inputs(const dspk__sub_ctx *ctx, int rc, const dspk__npy *npy,
                          char **files, int n, int i) {
  char what[1024];
  for (int k = i >= 0 ? i : 0; rc == DSPK_EIO && k < (i >= 0 ? i + 1 : n); k++) {
    struct stat st;
    if (!npy[k].map || fstat(npy[k].map_fd, &st) != 0 ||
        (uint64_t)st.st_size >= (uint64_t)npy[k].map_len)
      continue;
    snprintf(what, sizeof what, "%s: the file changed while in use (%lld bytes now, "
             "%zu when it was read)", dspk__sub_arg(files[k]), (long long)st.st_size,
             npy[k].map_len);
    return dspk__sub_fail_client_at(ctx, rc, what);
  }
  if (i >= 0 && (rc == DSPK_EIO || rc == DSPK_EPERM)) {
    snprintf(what, sizeof what, "%s", dspk__sub_arg(files[i]));
    return dspk__sub_fail_client_at(ctx, rc, what);
  }
  return dspk__sub_fail_client(ctx, rc);
}

static int offload_inputs(dspk__sub_ctx *ctx, const op_args *a, const dspk__npy *npy,
                          char **files, dspk_tensor *tin, int n, dspk_op op) {
  size_t total = 0, shm_min = dspk__sub_shared_threshold();
  int i, rc;
  /* With DSPK_SHARED_THRESHOLD set, big inputs go through shared memory
   * (protocol.md, Shared memory): a .npy file is no memfd (it cannot be
   * sealed), so its data is copied once into one, which the daemon then
   * reads in place; the request carries a reference.  Not for a raw
   * kernel, whose inline inputs come back. */
  /* A shared buffer pins the task to its device: for "any" only when that
   * can be nothing but cpu:0 (no hardware device), as the library does. */
  const char *dev = a->device && strcmp(a->device, "any") != 0 ? a->device : NULL;
  if (!dev && shm_min) {
    dspk_device_list *l = NULL;
    bool hw = true;
    if (dspk_devices(ctx->client, false, &l) == 0) {
      hw = false;
      for (size_t k = 0; k < l->ndevices; k++)
        hw |= strcmp(l->devices[k].backend, "cpu") != 0 && !l->devices[k].software;
    }
    dspk_device_list_free(l);
    if (hw)
      shm_min = 0;
    else
      dev = "cpu:0";
  }
  bool shared[MAX_INPUTS] = {false}; /* n <= MAX_INPUTS */
  for (i = 0; op != DSPK_OP_KERNEL && shm_min && i < n; i++) {
    void *p;
    uint64_t id;
    if (tin[i].nbytes < shm_min)
      continue;
    /* A mapped .npy file: the kernel copies its data into the shared
     * memory (sendfile), far cheaper than writing the mapping from here. */
    int fd = npy[i].map ? open(files[i], O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0) {
      uint64_t off = (uint64_t)((const char *)npy[i].data - (const char *)npy[i].map);
      rc = dspk_shared_from_file(ctx->client, dev, fd, off, tin[i].nbytes, &p, &id);
      close(fd);
    } else {
      rc = dspk_shared_alloc(ctx->client, dev, tin[i].nbytes, &p, &id);
      if (rc == 0)
        memcpy(p, tin[i].data, tin[i].nbytes);
    }
    /* Shared memory that cannot be had (a file size limit below its size,
     * no memfd or descriptor here, more than this process can map, the
     * daemon's max_buffers or a quota) leaves the input to the socket, as
     * libdspkclient does with its own temporaries (dspk.h,
     * dspk_set_shared_threshold; probe 20 D4: ulimit -f failed the command
     * with ELIMIT).  A broken connection, a timeout, no such device, and a
     * file that cannot be read stay the command's failure: the socket would
     * meet them too. */
    if (rc == DSPK_ECLOSED || rc == DSPK_ETIMEDOUT || rc == DSPK_ENODEV || rc == DSPK_EIO)
      return dspk__sub_fail_inputs(ctx, rc, npy, files, n, i);
    if (rc < 0)
      continue;
    tin[i].data = p; /* freed with the connection */
    shared[i] = true;
  }
  for (i = 0; i < n; i++)
    if (!shared[i])
      total += tin[i].nbytes;
  size_t lim = inline_max(ctx->client), small = INLINE_SMALL;
  if (total <= lim)
    return 0;
  if (n > 0 && lim / (size_t)n < small)
    small = lim / (size_t)n;
  for (i = 0; i < n; i++) {
    uint64_t id;
    if (!tin[i].nbytes || tin[i].nbytes < small || shared[i])
      continue;
    rc = dspk_buffer_create(ctx->client, a->device ? a->device : "any",
                            tin[i].nbytes, &id);
    if (rc == 0)
      rc = dspk_buffer_write(ctx->client, id, 0, tin[i].data, tin[i].nbytes);
    if (rc < 0)
      return dspk__sub_fail_inputs(ctx, rc, npy, files, n, i);
    tin[i].is_ref = true;
    tin[i].buffer = id;
    tin[i].offset = 0;
    tin[i].data = NULL;
  }
  return 0;
}

/* Where a result's data goes in a new .npy file: after the header that
 * dspk__npy_header_build makes for every shape of up to 8 axes whose text
 * fits (128 bytes); a longer one moves the data (save_landed). */
#define NPY_HEAD 128

/* Runs t.  When the output is a temporary file (a new or replaced regular
 * file), a large first output is received straight into it at NPY_HEAD
 * (dspk_result_to_file: the kernel moves it from the socket to the file's
 * pages) and *landed says so; otherwise, or when that cannot be, it comes
 * into memory as usual. */
static int run_into(dspk__sub_ctx *ctx, const dspk_task *t, dspk_result *res,
                    const dspk__outfile *of, bool *landed) {
  uint32_t tk;
  int rc;
  *landed = false;
  if (of->fd < 0 || !of->tmp)
    return dspk_run(ctx->client, t, res);
  if ((rc = dspk_submit(ctx->client, t, &tk)) != 0)
    return rc;
  (void)dspk_result_to_file(ctx->client, tk, of->fd, NPY_HEAD, landed); /* else: as usual */
  return dspk_wait(ctx->client, tk, res);
}

/* dspk__sub_save for an output whose data run_into put in the file at
 * NPY_HEAD: writes the header before it; a header of another length gets
 * the file written anew from a copy of the data (o->data maps the file). */
static int save_landed(const dspk_tensor *o, dspk__outfile *of, const char *path, char *err,
                       size_t errlen) {
  uint64_t shape[DSPK_MAX_RANK];
  unsigned char *hdr = NULL;
  size_t hlen = 0;
  char detail[256];
  int rc;
  for (unsigned k = 0; k < o->rank; k++)
    shape[k] = (uint64_t)o->shape[k];
  if (dspk__npy_header_build(o->dtype, (int)o->rank, shape, &hdr, &hlen) == 0 &&
      hlen == NPY_HEAD) {
    ssize_t w = pwrite(of->fd, hdr, hlen, 0);
    free(hdr);
    if (w != (ssize_t)hlen) {
      snprintf(err, errlen, "%s: %s", path, w < 0 ? strerror(errno) : "short write");
      dspk__outfile_abort(of);
      return DSPK_EIO;
    }
    rc = dspk__outfile_commit(of, detail, sizeof detail);
    if (rc < 0)
      snprintf(err, errlen, "%s: %s", path, detail);
    return rc;
  }
  free(hdr);
  {
    dspk_tensor copy = *o;
    void *p = malloc(o->nbytes ? o->nbytes : 1);
    if (!p) {
      snprintf(err, errlen, "%s: out of memory", path);
      dspk__outfile_abort(of);
      return DSPK_ENOMEM;
    }
    memcpy(p, o->data, o->nbytes);
    copy.data = p;
    if (ftruncate(of->fd, 0) != 0 || lseek(of->fd, 0, SEEK_SET) != 0) {
      snprintf(err, errlen, "%s: %s", path, strerror(errno));
      free(p);
      dspk__outfile_abort(of);
      return DSPK_EIO;
    }
    rc = dspk__sub_save(&copy, of, path, err, errlen);
    free(p);
    return rc;
  }
}

/* Loads the inputs, runs task t (inputs filled in here) and writes or
 * prints the result.  Returns the exit status. */
static int run_task(dspk__sub_ctx *ctx, const op_args *a, dspk_task *t,
                    char **files, int nfiles) {
  dspk__npy in[MAX_INPUTS];
  dspk_tensor tin[MAX_INPUTS];
  dspk_result res;
  dspk__outfile of = {-1, NULL, NULL, false};
  progress_state ps = {isatty(STDERR_FILENO) == 1, false, ctx->cmd};
  char err[768];
  int i, rc, status = DSPK__SUB_EXIT_FAIL, loaded = 0;
  bool landed = false;

  memset(in, 0, sizeof in);
  memset(&res, 0, sizeof res);
  if (dspk__sub_check_inputs(ctx, files, nfiles) != 0)
    return DSPK__SUB_EXIT_USAGE;
  /* The result (its line, or the array) always goes to standard output. */
  if (dspk__sub_check_std(ctx, true, files, nfiles, &a->output, 1) != 0)
    return DSPK__SUB_EXIT_FAIL;
  for (i = 0; i < nfiles; i++) {
    int64_t shape[DSPK_MAX_RANK];
    rc = dspk__npy_input(files[i], &in[i], err, sizeof err);
    if (rc < 0) {
      dspk__sub_fail(ctx, rc, "%s", err);
      goto out;
    }
    loaded++;
    for (int k = 0; k < in[i].rank; k++)
      shape[k] = (int64_t)in[i].shape[k];
    dspk_tensor_inline(&tin[i], in[i].dtype, (unsigned)in[i].rank, shape,
                       in[i].data);
  }
  /* reduce's axes are checked here, against X's rank, as the user wrote
   * them ("--axis 0,-2" names one axis twice). */
  for (unsigned k = 0; t->op == DSPK_OP_REDUCE && k < a->naxes; k++) {
    int r = in[0].rank, ax = a->axes[k];
    if (ax < -r || ax >= r) {
      if (r == 0)
        status = dspk__sub_usage(ctx, "--axis %d: %s has rank 0 (no axes)", ax, files[0]);
      else
        status = dspk__sub_usage(ctx, "--axis %d: %s has rank %d (axes %d..%d)", ax,
                                 files[0], r, -r, r - 1);
      goto out;
    }
    for (unsigned j = 0; j < k; j++)
      if ((a->axes[j] + r) % r == (ax + r) % r) {
        status = dspk__sub_usage(ctx, "--axis %d and %d name the same axis of %s "
                                      "(rank %d)", a->axes[j], ax, files[0], r);
        goto out;
      }
  }
  ctx->inputs = files;
  ctx->ninputs = nfiles;
  t->inputs = tin;
  t->ninputs = (unsigned)nfiles;
  t->device = a->device;

  /* The output exists (as its temporary) before any work is done. */
  if (a->output != NULL && (status = dspk__sub_open_output(ctx, a->output, &of)) != 0)
    goto out;
  status = DSPK__SUB_EXIT_FAIL;
  rc = dspk__sub_connect(ctx);
  if (rc != 0)
    goto out;
  /* Mapped inputs go from their files to the socket (sendfile), not
   * through this process's memory.  Best effort: unregistered, the mapping
   * is sent as memory. */
  for (i = 0; i < loaded; i++)
    if (in[i].map)
      (void)dspk_file_data(ctx->client, in[i].map, in[i].map_len, in[i].map_fd, 0);
  if (offload_inputs(ctx, a, in, files, tin, nfiles, t->op) != 0)
    goto out;
  dspk_set_progress(ctx->client, on_progress, &ps);
  rc = run_into(ctx, t, &res, &of, &landed);
  dspk_set_progress(ctx->client, NULL, NULL);
  if (rc < 0) { /* named while the inputs are still open */
    if (ps.drawn)
      fputs("\r\033[K", stderr);
    ps.drawn = false;
    dspk__sub_fail_inputs(ctx, rc, in, files, loaded, -1);
  }
  /* The inputs may be mappings of files the output is about to replace. */
  for (i = 0; i < loaded; i++) {
    if (in[i].map)
      (void)dspk_file_data(ctx->client, in[i].map, 0, -1, 0);
    dspk__npy_free(&in[i]);
  }
  loaded = 0;
  if (ps.drawn) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
  if (rc < 0)
    goto out;
  if (res.nout < 1 || res.out[0].is_ref) {
    dspk__sub_fail(ctx, DSPK_EPROTO, "the daemon returned no inline output");
    goto out_res;
  }
  if (a->output != NULL) {
    if (landed) {
      rc = save_landed(&res.out[0], &of, a->output, err, sizeof err);
    } else if (of.tmp && ftruncate(of.fd, 0) != 0) { /* what a failed landing left */
      snprintf(err, sizeof err, "%s: %s", a->output, strerror(errno));
      dspk__outfile_abort(&of);
      rc = DSPK_EIO;
    } else {
      rc = dspk__sub_save(&res.out[0], &of, a->output, err, sizeof err);
    }
    if (rc < 0) {
      dspk__sub_fail(ctx, rc, "%s", err);
      goto out_res;
    }
  }
  {
    /* The report goes to stdout, unless the array itself does. */
    FILE *f = a->output && of.to_stdout ? stderr : stdout;
    const char *saved[DSPK_MAX_OUTPUTS] = {a->output};
    dspk_result first = res; /* a view: the commands return output 0 */
    first.nout = 1;
    if (a->json) {
      clearerr(f);
      errno = 0;
      dspk__sub_json_result(f, &first, saved);
      if ((status = dspk__sub_json_written(ctx, f)) != DSPK__SUB_EXIT_OK)
        goto out_res;
    } else {
      dspk__sub_print_summary(f, &res, &res.out[0], a->output);
    }
  }
  status = DSPK__SUB_EXIT_OK;
out_res:
  dspk_result_free(&res);
out:
  dspk__outfile_abort(&of); /* nothing left when saved */
  for (i = 0; i < loaded; i++)
    dspk__npy_free(&in[i]);
  return status;
}

/* ---- the commands ------------------------------------------------------- */

int dspk__sub_gemm(dspk__sub_ctx *ctx, int argc, char **argv) {
  op_args a = {.set = &dspk__sub_op_optsets[SET_GEMM]};
  dspk_task t;
  int rc = parse_op_args(ctx, argc, argv, &a);
  if (rc >= 0)
    return rc;
  rc = want_pos(ctx, &a, 2, 3, a.npos == 0 ? "A.npy and B.npy" : "B.npy");
  if (rc >= 0)
    return rc;
  if (a.have_beta && a.npos < 3)
    return dspk__sub_usage(ctx, "--beta needs the C.npy operand");
  dspk_task_init(&t, DSPK_OP_GEMM);
  t.gemm.trans_a = a.trans_a;
  t.gemm.trans_b = a.trans_b;
  t.gemm.alpha = a.alpha;
  /* A given C is meant to be added: beta defaults to 1 then. */
  t.gemm.beta = a.have_beta ? a.beta : a.npos == 3 ? 1.0 : 0.0;
  return run_task(ctx, &a, &t, a.pos, a.npos);
}

int dspk__sub_fft(dspk__sub_ctx *ctx, int argc, char **argv) {
  op_args a = {.set = &dspk__sub_op_optsets[SET_FFT]};
  dspk_task t;
  int rc = parse_op_args(ctx, argc, argv, &a);
  if (rc >= 0)
    return rc;
  rc = want_pos(ctx, &a, 1, 1, "X.npy");
  if (rc >= 0)
    return rc;
  dspk_task_init(&t, DSPK_OP_FFT);
  t.fft.inverse = a.inverse;
  return run_task(ctx, &a, &t, a.pos, a.npos);
}

int dspk__sub_fir(dspk__sub_ctx *ctx, int argc, char **argv) {
  op_args a = {.set = &dspk__sub_op_optsets[SET_FIR]};
  dspk_task t;
  int rc = parse_op_args(ctx, argc, argv, &a);
  if (rc >= 0)
    return rc;
  rc = want_pos(ctx, &a, 2, 2, a.npos == 0 ? "X.npy and H.npy" : "H.npy");
  if (rc >= 0)
    return rc;
  dspk_task_init(&t, DSPK_OP_FIR);
  return run_task(ctx, &a, &t, a.pos, a.npos);
}

/* Whether letter c is among the first n of labels. */
static bool has_label(const char *labels, int n, char c) {
  return memchr(labels, c, (size_t)n) != NULL;
}

/* SUBSCRIPTS checked as the daemon checks them whatever the operands are
 * (backends/op.c, dspk__contract_parse; protocol.md, contract): two terms
 * of at most DSPK_MAX_RANK distinct letters, a comma, "->" and the
 * output's term of letters of A or B; spaces are ignored.  NULL when well
 * formed, else why not, in why.  Only the ranks and sizes of the operands
 * are left to the daemon. */
static const char *subscripts_error(const char *s, char *why, size_t cap, bool *own_form) {
  static const char *names[] = {"A", "B", "output"};
  char l[3][DSPK_MAX_RANK];
  int term = 0, n[3] = {0, 0, 0};
  bool arrow = false;
  if (strlen(s) >= 64) /* the daemon's DSPK__SUBSCRIPTS_MAX, with the NUL */
    return "longer than 63 characters";
  for (size_t i = 0; s[i] != '\0'; i++) {
    char c = s[i];
    if (c == ' ')
      continue;
    if (c == ',') {
      if (term != 0)
        return "exactly two operands are supported";
      term = 1;
    } else if (c == '-' && s[i + 1] == '>') {
      if (term != 1 || arrow)
        return "'->' must come once, after the second operand";
      arrow = true;
      term = 2;
      i++;
    } else if (c == '.') {
      return "an ellipsis (...) is not supported";
    } else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      /* The whole character, named as the daemon and the library name it
       * (protocol.md, "Errors"; dspk__utf8_char_name): "'+'", "'é'
       * (U+00E9)", "U+200B", "byte 0xff". */
      char cn[32];
      snprintf(why, cap, "%s is not a letter (labels are a-z, A-Z)",
               dspk__utf8_char_name(cn, sizeof cn, s + i, strlen(s + i)));
      return why;
    } else if (n[term] == DSPK_MAX_RANK) {
      snprintf(why, cap, "the %s term has more than %d labels", names[term], DSPK_MAX_RANK);
      return why;
    } else if (has_label(l[term], n[term], c)) {
      snprintf(why, cap, "label '%c' repeats in the %s term (diagonals and traces are not "
               "supported)", c, names[term]);
      return why;
    } else {
      l[term][n[term]++] = c;
    }
  }
  if (!arrow && term == 0)
    return "needs two operands and an explicit output (\"A,B->out\")";
  if (!arrow) {
    /* This call's subscripts made explicit as numpy's implicit mode reads
     * them, in the daemon's words (backends/op.c; probe 20 B1): the labels
     * that appear once, A-Z then a-z. */
    char out[2 * DSPK_MAX_RANK + 1];
    int no = 0;
    for (int c = 'A'; c <= 'z'; c++)
      if (((c >= 'A' && c <= 'Z') || c >= 'a') &&
          has_label(l[0], n[0], (char)c) + has_label(l[1], n[1], (char)c) == 1)
        out[no++] = (char)c;
    out[no] = '\0';
    snprintf(why, cap, "needs an explicit output: \"%s->%s\" for numpy's implicit one (the "
             "labels that appear once, A-Z then a-z)", s, out);
    *own_form = true;
    return why;
  }
  for (int k = 0; k < n[2]; k++)
    if (!has_label(l[0], n[0], l[2][k]) && !has_label(l[1], n[1], l[2][k])) {
      snprintf(why, cap, "output label '%c' appears in neither A nor B", l[2][k]);
      return why;
    }
  return NULL;
}

int dspk__sub_contract(dspk__sub_ctx *ctx, int argc, char **argv) {
  op_args a = {.set = &dspk__sub_op_optsets[SET_CONTRACT]};
  dspk_task t;
  int rc = parse_op_args(ctx, argc, argv, &a);
  if (rc >= 0)
    return rc;
  rc = want_pos(ctx, &a, 3, 3,
                a.npos == 0   ? "SUBSCRIPTS, A.npy and B.npy"
                : a.npos == 1 ? "A.npy and B.npy"
                              : "B.npy");
  if (rc >= 0)
    return rc;
  char why[256];
  bool own_form = false; /* the reason gives this call's own form: no example */
  const char *bad = subscripts_error(a.pos[0], why, sizeof why, &own_form);
  if (bad != NULL)
    return dspk__sub_usage(ctx, "bad SUBSCRIPTS '%s': %s%s", dspk__sub_arg(a.pos[0]), bad,
                           own_form ? "" : " (like 'ik,kj->ij')");
  dspk_task_init(&t, DSPK_OP_CONTRACT);
  t.contract.subscripts = a.pos[0];
  return run_task(ctx, &a, &t, a.pos + 1, 2);
}

int dspk__sub_reduce(dspk__sub_ctx *ctx, int argc, char **argv) {
  static const char *names[] = {
#define RED_NAME(e, name) name,
      DSPK_REDUCE_MAP(RED_NAME)
#undef RED_NAME
  };
  op_args a = {.set = &dspk__sub_op_optsets[SET_REDUCE]};
  dspk_task t;
  int fn = -1;
  int rc = parse_op_args(ctx, argc, argv, &a);
  if (rc >= 0)
    return rc;
  rc = want_pos(ctx, &a, 2, 2, a.npos == 0 ? "FN and X.npy" : "X.npy");
  if (rc >= 0)
    return rc;
  for (int i = 0; i < DSPK_REDUCE_COUNT; i++)
    if (strcmp(a.pos[0], names[i]) == 0)
      fn = i;
  if (fn < 0)
    return dspk__sub_usage(ctx, "unknown reduction '%s' (want sum, max, min "
                                "or mean)",
                           dspk__sub_arg(a.pos[0]));
  dspk_task_init(&t, DSPK_OP_REDUCE);
  t.reduce.fn = (dspk_reduce)fn;
  t.reduce.naxes = a.naxes;
  memcpy(t.reduce.axes, a.axes, sizeof a.axes);
  return run_task(ctx, &a, &t, a.pos + 1, 1);
}

int dspk__sub_map(dspk__sub_ctx *ctx, int argc, char **argv) {
  static const struct {
    const char *name;
    int nin;
  } fns[] = {
#define MAP_FN(e, name, nin) {name, nin},
      DSPK_MAPFN_MAP(MAP_FN)
#undef MAP_FN
  };
  op_args a = {.set = &dspk__sub_op_optsets[SET_MAP]};
  dspk_task t;
  int fn = -1;
  int rc = parse_op_args(ctx, argc, argv, &a);
  if (rc >= 0)
    return rc;
  rc = want_pos(ctx, &a, 2, 3, a.npos == 0 ? "FN and A.npy" : "A.npy");
  if (rc >= 0)
    return rc;
  for (int i = 0; i < DSPK_MAPFN_COUNT; i++)
    if (strcmp(a.pos[0], fns[i].name) == 0)
      fn = i;
  if (fn < 0)
    return dspk__sub_usage(ctx, "unknown function '%s' (want add, sub, mul, "
                                "scale, axpy, abs or exp)",
                           dspk__sub_arg(a.pos[0]));
  if (a.npos - 1 != fns[fn].nin)
    return dspk__sub_usage(ctx, "map %s takes %d input%s, got %d", a.pos[0],
                           fns[fn].nin, fns[fn].nin == 1 ? "" : "s",
                           a.npos - 1);
  /* The table's rule, which --list-options follows too. */
  char word[16];
  snprintf(word, sizeof word, " %s ", fns[fn].name);
  if (a.have_alpha && strstr(a.set->operands, word) == NULL)
    return dspk__sub_usage(ctx, "--alpha applies to scale and axpy only");
  dspk_task_init(&t, DSPK_OP_MAP);
  t.map.fn = (dspk_mapfn)fn;
  t.map.alpha = a.alpha;
  return run_task(ctx, &a, &t, a.pos + 1, a.npos - 1);
}

int dspk__sub_output_dir(const dspk__sub_ctx *ctx, const char *path) {
  struct stat st;
  /* A directory: named so, as a usage error, before the work is done. */
  if (strcmp(path, "-") != 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return dspk__sub_usage(ctx, "-o %s: is a directory", dspk__sub_arg(path));
  return 0;
}

int dspk__sub_open_output(const dspk__sub_ctx *ctx, const char *path,
                          dspk__outfile *of) {
  char err[256];
  int rc = dspk__sub_output_dir(ctx, path);
  if (rc != 0)
    return rc;
  rc = dspk__outfile_open(of, path, err, sizeof err);
  if (rc < 0)
    return dspk__sub_fail(ctx, rc, "%s: %s",
                          strcmp(path, "-") == 0 ? "<stdout>" : dspk__sub_arg(path), err);
  /* A binary .npy never goes to a terminal, whatever names it: "-",
   * /dev/stdout, /dev/fd/1, /proc/self/fd/1, /dev/tty, /dev/pts/N.  What
   * the descriptor is open on decides, not the spelling of the path. */
  if (isatty(of->fd) == 1) {
    bool dash = strcmp(path, "-") == 0;
    dspk__outfile_abort(of);
    if (dash || of->to_stdout)
      return dspk__sub_usage(ctx, "-o %s: standard output is a terminal; redirect it to a "
                                  "file or a pipe", dspk__sub_arg(path));
    return dspk__sub_usage(ctx, "-o %s: that is a terminal, where a .npy does not go; name "
                                "a file or a pipe", dspk__sub_arg(path));
  }
  return 0;
}

int dspk__sub_save(const dspk_tensor *o, dspk__outfile *of, const char *path,
                   char *err, size_t errlen) {
  uint64_t shape[DSPK_MAX_RANK];
  char detail[256];
  int rc;
  for (unsigned k = 0; k < o->rank; k++)
    shape[k] = (uint64_t)o->shape[k];
  rc = dspk__npy_write_fd(of->fd, o->dtype, (int)o->rank, shape, o->data,
                          detail, sizeof detail);
  if (rc == 0)
    rc = dspk__outfile_commit(of, detail, sizeof detail);
  else
    dspk__outfile_abort(of);
  /* Standard output is named as every write to it is (main.c). */
  if (rc < 0)
    snprintf(err, errlen, "%s: %s", strcmp(path, "-") == 0 ? "<stdout>" : path,
             detail);
  return rc;
}

/* A named input that is a directory or a terminal is refused before
 * anything is read: a directory gives only open(2)'s words later, and a
 * terminal would wait for typing that never makes a .npy.  array: path is
 * an array operand (FILE.npz:NAME names a member), not kernel's SOURCE. */
static int check_input_file(const dspk__sub_ctx *ctx, const char *path, bool array) {
  struct stat st;
  size_t plen = array ? dspk__npz_path_len(path) : 0;
  /* FILE.npz:NAME: the archive's path is the file */
  char *file = plen > 0 ? strndup(path, plen) : NULL;
  int rc = stat(file != NULL ? file : path, &st);
  free(file);
  if (rc != 0)
    return 0; /* the load says why */
  if (S_ISDIR(st.st_mode)) {
    dspk__sub_usage(ctx, "%s: is a directory",
                    dspk__sub_arg_n(path, plen > 0 ? plen : strlen(path)));
    return -1;
  }
  if (S_ISCHR(st.st_mode)) {
    int fd = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    /* /dev/tty without a controlling terminal cannot be opened (ENXIO):
     * a terminal all the same. */
    bool tty = fd >= 0 ? isatty(fd) == 1 : errno == ENXIO && strcmp(path, "/dev/tty") == 0;
    if (fd >= 0)
      close(fd);
    if (tty) {
      dspk__sub_usage(ctx, "%s: is a terminal; give a file or - for a pipe", dspk__sub_arg(path));
      return -1;
    }
  }
  return 0;
}

int dspk__sub_check_inputs(const dspk__sub_ctx *ctx, char *const *files,
                         int nfiles) {
  int fds[64];
  for (int i = 0; i < nfiles; i++) {
    /* kernel's files[0] is its SOURCE, not an array. */
    bool source = i == 0 && ctx->cmd != NULL && strcmp(ctx->cmd, "kernel") == 0;
    size_t plen = source ? 0 : dspk__npz_path_len(files[i]);
    if (files[i][0] == '\0') {
      dspk__sub_usage(ctx, "empty input file name");
      return -1;
    }
    /* "FILE.npz:" names no array: malformed whatever the file holds, so
     * a bad command line, as "-:NAME" and an empty item are (probe 22 D4:
     * it was found on opening the archive, exit status 1). */
    if (plen > 0 && files[i][plen + 1] == '\0') {
      const char *npz = dspk__sub_arg_n(files[i], plen);
      dspk__sub_usage(ctx, "'%s': empty array name after ':' (give %s:NAME, or %s alone "
                           "for its only array)", dspk__sub_arg(files[i]), npz, npz);
      return -1;
    }
    /* "-" and the names of a descriptor (/dev/stdin, /dev/fd/0,
     * /proc/self/fd/0...) are one stream however spelled: read once, and
     * never from a terminal. */
    fds[i < 64 ? i : 63] = dspk__fd_alias(files[i]);
    if (i >= 64 || fds[i] < 0) {
      if (check_input_file(ctx, files[i], !source) != 0)
        return -1;
      continue;
    }
    for (int j = 0; j < i; j++)
      if (fds[j] == fds[i]) {
        if (fds[i] == STDIN_FILENO)
          dspk__sub_usage(ctx, "standard input can be read only once ('%s' and '%s' "
                               "both read it)", dspk__sub_arg(files[j]), dspk__sub_arg(files[i]));
        else
          dspk__sub_usage(ctx, "descriptor %d can be read only once ('%s' and '%s' "
                               "both read it)", fds[i], dspk__sub_arg(files[j]),
                          dspk__sub_arg(files[i]));
        return -1;
      }
    if (isatty(fds[i]) == 1) {
      if (fds[i] == STDIN_FILENO)
        dspk__sub_usage(ctx, "%s: standard input is a terminal; pipe %s into it",
                        dspk__sub_arg(files[i]), source ? "the kernel source" : "a .npy");
      else
        dspk__sub_usage(ctx, "%s: descriptor %d is a terminal; pipe %s into it",
                        dspk__sub_arg(files[i]), fds[i],
                        source ? "the kernel source" : "a .npy");
      return -1;
    }
  }
  return 0;
}
