/*
 * dspk-submit kernel: run a raw kernel (CUDA C, HIP, GLSL or SPIR-V source)
 * on a device through task.run with op "kernel".
 *
 * Kernel arguments are given in order on the command line: .npy files and
 * zero-filled tensors ("zeros:f32:4x5") become the task's tensor inputs,
 * "i32:5" and friends become scalars.  A kernel writes its results into its
 * tensor arguments in place, and the daemon returns every tensor argument
 * after the run; -o FILE (repeatable, or -o K=FILE for the tensor argument
 * K) saves them as .npy, and without -o a summary of each is printed.  The
 * source language comes from --lang or the file's extension.  A compile
 * error (ECOMPILE) carries the compiler's log, folded onto the one error
 * line like every other message.
 */
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/submit/npy.h"
#include "client/submit/submit.h"

/* Tensor arguments per kernel: the daemon's limit on task inputs (4), and
 * no more than the library returns as outputs, since the daemon returns
 * every tensor argument. */
#define KERNEL_MAX_TENSORS (DSPK_MAX_OUTPUTS < 4 ? DSPK_MAX_OUTPUTS : 4)
/* Largest source file read. */
#define KERNEL_MAX_SOURCE (16u << 20)

typedef struct kernel_out {
  int index; /* tensor argument, -1: the next one in order */
  const char *path;
  const char *spec; /* the -o value as given ("1=y.npy"), for messages */
} kernel_out;

/* Reads path ("-" for stdin) into a malloc'd buffer. */
static int read_source(dspk__sub_ctx *ctx, const char *path, char **out,
                       size_t *len) {
  FILE *f;
  size_t cap = 1 << 16, n = 0;
  char *buf;
  if (dspk__std_closed(dspk__fd_alias(path)))
    return dspk__sub_fail(ctx, DSPK_ENOENT, "%s: descriptor %d is not open",
                          dspk__std_name(dspk__fd_alias(path)), dspk__fd_alias(path));
  f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    return dspk__sub_fail(ctx, dspk__path_code(e), "%s: %s",
                          dspk__sub_arg(path), strerror(e));
  }
  buf = malloc(cap);
  while (buf != NULL) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0)
      break;
    if (n == cap) {
      char *nb = cap >= KERNEL_MAX_SOURCE ? NULL : realloc(buf, cap * 2);
      if (nb == NULL) {
        free(buf);
        buf = NULL;
        if (f != stdin)
          fclose(f);
        return dspk__sub_fail(ctx, DSPK_ELIMIT,
                              "%s: source larger than %u bytes", dspk__sub_arg(path),
                              KERNEL_MAX_SOURCE);
      }
      buf = nb;
      cap *= 2;
    }
  }
  if (buf == NULL || ferror(f)) {
    free(buf);
    if (f != stdin)
      fclose(f);
    return dspk__sub_fail(ctx, DSPK_EIO, "%s: cannot read", dspk__sub_arg(path));
  }
  if (f != stdin)
    fclose(f);
  *out = buf;
  *len = n;
  return 0;
}

static const char *lang_from_path(const char *path) {
  const char *dot = strrchr(path, '.');
  if (dot == NULL)
    return "cuda";
  if (strcmp(dot, ".hip") == 0)
    return "hip";
  if (strcmp(dot, ".comp") == 0 || strcmp(dot, ".glsl") == 0)
    return "glsl";
  if (strcmp(dot, ".spv") == 0)
    return "spirv";
  return "cuda";
}

/* "X[,Y[,Z]]" into three positive dimensions. */
static int parse_dim3(const char *s, uint32_t d[3]) {
  char buf[96], *items[3];
  int n = dspk__sub_split(s, ",x", buf, sizeof buf, items, 3);
  d[0] = d[1] = d[2] = 1;
  for (int i = 0; i < n; i++) {
    long v;
    if (dspk__sub_parse_long(items[i], 1, UINT32_MAX, &v) < 0)
      return -1;
    d[i] = (uint32_t)v;
  }
  return n > 0 ? 0 : -1;
}

/* Elements of a zeros: tensor at most (the product of its dimensions). */
#define ZEROS_MAX_COUNT (1ull << 31)

/* "zeros:DTYPE:D0xD1x..." into a zero-filled array. */
static int parse_zeros(dspk__sub_ctx *ctx, const char *spec, dspk__npy *a) {
  char buf[256], dbuf[256], *dt, *dims, *items[DSPK_MAX_RANK + 1];
  size_t is;
  bool big = false;
  int n;
  snprintf(buf, sizeof buf, "%s", spec + 6);
  dt = buf;
  dims = strchr(buf, ':');
  memset(a, 0, sizeof *a);
  if (dims == NULL)
    return dspk__sub_usage(ctx, "bad '%s' (want zeros:DTYPE:D0xD1...)", dspk__sub_arg(spec));
  *dims++ = '\0';
  if (dspk_dtype_from_name(dt, &a->dtype) < 0) {
    /* The dtypes the library knows, in its order, as every other bad
     * value on the line lists what it wants. */
    char want[128] = "";
    size_t w = 0;
    for (int k = 0; k < DSPK_DTYPE_COUNT && w < sizeof want; k++)
      w += (size_t)snprintf(want + w, sizeof want - w, "%s%s",
                            k == 0 ? "" : k + 1 == DSPK_DTYPE_COUNT ? " or " : ", ",
                            dspk_dtype_name((dspk_dtype)k));
    return dspk__sub_usage(ctx, "bad dtype '%s' in '%s' (want %s)", dspk__sub_arg(dt),
                           dspk__sub_arg(spec), want);
  }
  a->count = 1;
  n = dspk__sub_split(dims, "x,", dbuf, sizeof dbuf, items, DSPK_MAX_RANK + 1);
  if (n > DSPK_MAX_RANK)
    return dspk__sub_usage(ctx, "bad shape in '%s' (want at most %d dimensions)",
                           dspk__sub_arg(spec),
                           DSPK_MAX_RANK);
  if (n < 0)
    return dspk__sub_usage(ctx, "bad shape in '%s' (want D0xD1... with no empty item)",
                           dspk__sub_arg(spec));
  for (int i = 0; i < n; i++) {
    unsigned long long v;
    /* Digits alone; a number past 64 bits is as large as any. */
    if (items[i][strspn(items[i], "0123456789")] != '\0')
      return dspk__sub_usage(ctx, "bad dimension '%s' in '%s' (want 0..%llu)",
                             dspk__sub_arg(items[i]),
                             dspk__sub_arg(spec), ZEROS_MAX_COUNT);
    errno = 0;
    v = strtoull(items[i], NULL, 10);
    big = big || errno == ERANGE || v > ZEROS_MAX_COUNT;
    a->shape[a->rank++] = big ? 0 : v;
    a->count = big ? 0 : a->count * v;
    big = big || a->count > ZEROS_MAX_COUNT;
  }
  is = dspk_dtype_size(a->dtype);
  if (big)
    return dspk__sub_usage(ctx, "'%s' is too large (want at most %llu elements)",
                           dspk__sub_arg(spec),
                           ZEROS_MAX_COUNT);
  a->nbytes = (size_t)a->count * is;
  a->data = calloc(1, a->nbytes ? a->nbytes : 1);
  if (a->data == NULL)
    return dspk__sub_fail(ctx, DSPK_ENOMEM, "out of memory for '%s'", dspk__sub_arg(spec));
  return 0;
}

/* The integer scalars of the command line and their ranges. */
static const struct {
  const char *name;
  long lo, hi;
  dspk_karg_kind kind;
} int_kinds[] = {{"i32", INT32_MIN, INT32_MAX, DSPK_KARG_I32},
                 {"u32", 0, UINT32_MAX, DSPK_KARG_U32},
                 {"i64", INT64_MIN, INT64_MAX, DSPK_KARG_I64}};

/* A scalar "i32:5", "f64:2.5"...; returns 1 if spec is not a scalar. */
static int parse_scalar(dspk__sub_ctx *ctx, const char *spec, dspk_karg *k) {
  const char *v = strchr(spec, ':');
  double d;
  long l;
  int prc;
  if (v == NULL || v - spec != 3)
    return 1;
  v++;
  if (strncmp(spec, "f32", 3) == 0 || strncmp(spec, "f64", 3) == 0) {
    if ((prc = dspk__sub_parse_double(v, &d)) == -2)
      return dspk__sub_usage(ctx, "bad %.3s in '%s' (beyond %.3s's range)", spec,
                             dspk__sub_arg(spec), spec);
    if (prc < 0)
      return dspk__sub_usage(ctx, "bad %.3s in '%s' (want a number)", spec,
                             dspk__sub_arg(spec));
    k->kind = spec[1] == '3' ? DSPK_KARG_F32 : DSPK_KARG_F64;
    /* A value that rounds (to nearest even) to an infinity is refused like
     * an f64 beyond f64's: |d| >= 2^128 - 2^103, the midpoint between
     * FLT_MAX and 2^128 (below it, 3.4028235e38 say, it rounds to FLT_MAX;
     * the daemon's rule, proto/dtype.h; "inf" and "nan" are f32 values). */
    if (k->kind == DSPK_KARG_F32 && fabs(d) >= 0x1.ffffffp127 && !isinf(d))
      return dspk__sub_usage(ctx, "bad f32 in '%s' (beyond f32's range)", dspk__sub_arg(spec));
    /* An f32 read from the text at once (strtof rounds the decimal value
     * once): (float) of the double rounds twice (9007199791611905, that is
     * 2^53 + 2^29 + 1, became the tie 2^53 + 2^29, then 2^53, not the nearest
     * f32 2^53 + 2^30).  The syntax and the range were checked above, on the
     * double; a value the double put below the midpoint that the text
     * passes would round to an infinity here: refused the same way. */
    if (k->kind == DSPK_KARG_F32) {
      k->v.f32 = strtof(v, NULL);
      if (isinf(k->v.f32) && !isinf(d))
        return dspk__sub_usage(ctx, "bad f32 in '%s' (beyond f32's range)", dspk__sub_arg(spec));
    } else
      k->v.f64 = d;
    return 0;
  }
  for (size_t i = 0; i < sizeof int_kinds / sizeof int_kinds[0]; i++) {
    if (strncmp(spec, int_kinds[i].name, 3) != 0)
      continue;
    if (dspk__sub_parse_long(v, int_kinds[i].lo, int_kinds[i].hi, &l) < 0)
      return dspk__sub_usage(ctx, "bad %s in '%s' (want an integer, %ld..%ld)",
                             int_kinds[i].name, dspk__sub_arg(spec), int_kinds[i].lo,
                             int_kinds[i].hi);
    k->kind = int_kinds[i].kind;
    if (k->kind == DSPK_KARG_I32)
      k->v.i32 = (int32_t)l;
    else if (k->kind == DSPK_KARG_U32)
      k->v.u32 = (uint32_t)l;
    else
      k->v.i64 = l;
    return 0;
  }
  return 1;
}

static const struct option kernel_opts[] = {
    {"entry", required_argument, NULL, 'e'},  {"grid", required_argument, NULL, 'g'},
    {"block", required_argument, NULL, 'b'},  {"shared", required_argument, NULL, 's'},
    {"lang", required_argument, NULL, 'l'},   {"device", required_argument, NULL, 'd'},
    {"output", required_argument, NULL, 'o'}, DSPK__SUB_OPTS_END};
const dspk__sub_optset dspk__sub_kernel_optsets[] = {
    {"kernel", ":e:g:b:s:l:d:o:h", kernel_opts, .repeats = "output"},
    {NULL, NULL, NULL, NULL, NULL, NULL}};

/* Whether the device whose devices entry starts at p lists lang among its
 * kernel_langs (the first after its id; its strings hold no quote: ids and
 * language names).  true when that cannot be told: the daemon decides. */
static bool device_takes(const char *p, const char *lang) {
  static const char key[] = "\"kernel_langs\":[";
  const char *k = strstr(p, key), *end = k ? strchr(k, ']') : NULL;
  size_t n = strlen(lang);
  if (end == NULL)
    return true;
  for (const char *q = k + sizeof key - 1; q < end && (q = strchr(q, '"')) != NULL && q < end;) {
    const char *qe = strchr(q + 1, '"');
    if (qe == NULL || qe > end)
      break;
    if ((size_t)(qe - q - 1) == n && strncmp(q + 1, lang, n) == 0)
      return true;
    q = qe + 1;
  }
  return false;
}

/* Whether the devices answer says that the device (NULL or "any": one of
 * the daemon's) runs raw kernels in lang (its kernel_langs, protocol.md).
 * false when it cannot be told so: the device is not listed (no such
 * device, or not the Slurm job's), lists another language or none (the
 * backend runs none, or raw_kernels turned them off), or no device at all
 * does.  The JSON's strings hold no unescaped quote: a key or an id is
 * found only as one. */
static bool lang_runs(dspk__sub_ctx *ctx, const char *device, const char *lang) {
  static const char idkey[] = "\"id\":\"";
  bool any = device == NULL || strcmp(device, "any") == 0, runs = false;
  dspk_device_list *l = NULL;
  char id[128];
  const char *p;
  if (dspk_devices(ctx->client, false, &l) != 0 || l->json == NULL) {
    dspk_device_list_free(l);
    return false;
  }
  if (any) /* every entry's id */
    snprintf(id, sizeof id, "%s", idkey);
  else
    snprintf(id, sizeof id, "%s%s\"", idkey, device);
  for (p = strstr(l->json, id); p != NULL && !runs; p = any ? strstr(p + 1, id) : NULL)
    runs = device_takes(p, lang);
  dspk_device_list_free(l);
  return runs;
}

/* Asks the daemon whether the device takes a kernel of the task's language
 * at all, with a stand-in of the task small enough for any message: one
 * f32 element and a source that no compiler takes (#error; not SPIR-V).
 * The daemon checks the device before it compiles anything (resolve_device,
 * raw_kernels, the device's languages: daemon/methods.c), so a device it
 * would refuse for the real task answers here in the same words, and one it
 * would take answers ECOMPILE, which is no concern of this check: nothing
 * runs either way.  The daemon's ENODEV or ENOTSUP (the library's error
 * holds its text), or a refusal of the device parameter itself (a name
 * longer than the protocol allows), or 0 for any other answer. */
static int device_probe(dspk__sub_ctx *ctx, const dspk_task *task) {
  static const char src[] = "#error dspk-submit: a check of the device, never run\n";
  float one = 0.0f;
  dspk_tensor t;
  dspk_task p;
  dspk_result res;
  int64_t shape[1] = {1};
  int rc;
  dspk_task_init(&p, DSPK_OP_KERNEL);
  dspk_tensor_inline(&t, DSPK_F32, 1, shape, &one);
  p.device = task->device;
  p.ninputs = 1;
  p.inputs = &t;
  p.kernel.lang = task->kernel.lang;
  p.kernel.source = src;
  p.kernel.source_len = sizeof src - 1;
  p.kernel.entry = task->kernel.entry;
  for (int i = 0; i < 3; i++)
    p.kernel.grid[i] = p.kernel.block[i] = 1;
  p.kernel.nargs = 1;
  p.kernel.args[0].kind = DSPK_KARG_TENSOR;
  p.kernel.args[0].v.tensor = 0;
  rc = dspk_run(ctx->client, &p, &res);
  if (rc == 0) {
    dspk_result_free(&res);
    return 0;
  }
  /* A device name the daemon's decoder refuses ("device: longer than 47
   * bytes") is refused whatever the size too (outside probe 15 D4). */
  return rc == DSPK_ENODEV || rc == DSPK_ENOTSUP ||
                 strncmp(dspk_last_error(ctx->client), "device: ", 8) == 0
             ? rc
             : 0;
}

/* A kernel's tensors go to the daemon and come back inline, each way in
 * one message (no buffer, no shared memory stands for them): with SOURCE
 * they must fit the daemon's max_message less 1024 bytes of framing
 * (cli.md).  A device that would refuse the task whatever its size (no
 * such device, not the Slurm job's, no kernel of the language, raw kernels
 * turned off) is that refusal first, in the daemon's own words for a
 * smaller task, as the other commands' large operands get it (from their
 * shared memory, which names the device): the advice to raise max_message
 * would not help.  0, or the failure reported and its exit status. */
static int kernel_fits(dspk__sub_ctx *ctx, const dspk__npy *tens, int ntens,
                       const dspk_task *task) {
  size_t m = dspk_max_message(ctx->client), t = 0, srclen = task->kernel.source_len;
  int rc;
  for (int i = 0; i < ntens; i++)
    t += tens[i].nbytes; /* each at most 2^31 elements of 16 bytes */
  if (m > 1024 && t <= m - 1024 && srclen <= m - 1024 - t)
    return 0;
  if (!lang_runs(ctx, task->device, task->kernel.lang) && (rc = device_probe(ctx, task)) < 0)
    return dspk__sub_fail_client(ctx, rc);
  return dspk__sub_fail(ctx, DSPK_ELIMIT, "the tensor arguments (%zu bytes) and SOURCE "
                        "(%zu bytes) are more than one message of this daemon carries (its max_message, "
                        "%zu bytes, less 1024 for framing), and a kernel's tensors travel "
                        "inline, to the daemon and back; ask the daemon's admin to raise "
                        "max_message (dspkd --max-message, [limits] max_message of "
                        "dspkd.conf, dspk.conf(5))", t, srclen, m);
}

int dspk__sub_kernel(dspk__sub_ctx *ctx, int argc, char **argv) {
  const struct option *opts = kernel_opts;
  const char *entry = NULL, *lang = NULL, *device = NULL;
  uint32_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  long shared = 0;
  kernel_out outs[KERNEL_MAX_TENSORS];
  char *tnames[KERNEL_MAX_TENSORS];
  dspk__outfile ofs[KERNEL_MAX_TENSORS];
  int nouts = 0, ntens = 0, opt, rc, status = DSPK__SUB_EXIT_FAIL;
  dspk__npy tens[KERNEL_MAX_TENSORS];
  dspk_tensor tin[KERNEL_MAX_TENSORS];
  dspk_result res;
  dspk_task t;
  char *src = NULL, err[768];
  size_t srclen = 0;
  bool have_grid = false, have_block = false, json = false;
  bool seen_entry = false, seen_shared = false, seen_lang = false,
       seen_device = false;
  const char *saved[DSPK_MAX_OUTPUTS] = {NULL};

  memset(tens, 0, sizeof tens);
  memset(&res, 0, sizeof res);
  for (int i = 0; i < KERNEL_MAX_TENSORS; i++)
    ofs[i] = (dspk__outfile){-1, NULL, NULL, false};
  while ((opt = getopt_long(argc, argv, dspk__sub_kernel_optsets[0].shorts, opts, NULL)) !=
         -1) {
    switch (opt) {
    case 'e':
      if ((rc = dspk__sub_once(ctx, &seen_entry, opt, argv)) != 0)
        return rc;
      entry = optarg;
      break;
    case 'g':
      if ((rc = dspk__sub_once(ctx, &have_grid, opt, argv)) != 0)
        return rc;
      if (parse_dim3(optarg, grid) < 0)
        return dspk__sub_usage(ctx, "bad --grid '%s' (want X[,Y[,Z]], each "
                                    "1..4294967295)", dspk__sub_arg(optarg));
      have_grid = true;
      break;
    case 'b':
      if ((rc = dspk__sub_once(ctx, &have_block, opt, argv)) != 0)
        return rc;
      if (parse_dim3(optarg, block) < 0)
        return dspk__sub_usage(ctx, "bad --block '%s' (want X[,Y[,Z]], each "
                                    "1..4294967295)", dspk__sub_arg(optarg));
      have_block = true;
      break;
    case 's': {
      if ((rc = dspk__sub_once(ctx, &seen_shared, opt, argv)) != 0)
        return rc;
      uint64_t v;
      if (dspk__sub_parse_size(optarg, 0, UINT32_MAX, &v) < 0)
        return dspk__sub_usage(ctx, "bad --shared '%s' (want a size, 0..4294967295 "
                                    "bytes: " DSPK__SIZE_UNITS ", e.g. 4096 or 48K)",
                               dspk__sub_arg(optarg));
      shared = (long)v;
      break;
    }
    case 'l':
      if ((rc = dspk__sub_once(ctx, &seen_lang, opt, argv)) != 0)
        return rc;
      if (strcmp(optarg, "cuda") && strcmp(optarg, "hip") &&
          strcmp(optarg, "glsl") && strcmp(optarg, "spirv"))
        return dspk__sub_usage(ctx, "bad --lang '%s' (want cuda, hip, glsl "
                                    "or spirv)",
                               dspk__sub_arg(optarg));
      lang = optarg;
      break;
    case 'd':
      if ((rc = dspk__sub_once(ctx, &seen_device, opt, argv)) != 0)
        return rc;
      if (!*optarg) /* as the compute commands: not the library's "any" */
        return dspk__sub_usage(ctx, "empty --device (want an ID that 'dspk-submit "
                                    "devices' lists, or any)");
      device = optarg;
      break;
    case 'o': {
      const char *eq = strchr(optarg, '='), *spec = optarg;
      long k = -1;
      if (nouts >= KERNEL_MAX_TENSORS)
        return dspk__sub_usage(ctx, "more than %d -o", KERNEL_MAX_TENSORS);
      /* Whatever integer stands before the '=' is an index, in range or
       * not ("-o 9=y.npy" is no file named "9=y.npy": ./9=y.npy is). */
      size_t nd = eq != NULL ? (size_t)(eq - optarg) : 0;
      if (nd > 0 && strspn(optarg + (optarg[0] == '-'), "0123456789") ==
                        nd - (optarg[0] == '-') && nd > (size_t)(optarg[0] == '-')) {
        char num[32];
        snprintf(num, sizeof num, "%.*s", (int)nd, optarg);
        if (nd >= sizeof num ||
            dspk__sub_parse_long(num, 0, KERNEL_MAX_TENSORS - 1, &k) != 0)
          return dspk__sub_usage(ctx, "-o %s: there is no tensor argument %s (a kernel "
                                      "has at most %d, 0 to %d)",
                                 dspk__sub_arg(optarg), dspk__sub_arg_n(optarg, nd),
                                 KERNEL_MAX_TENSORS,
                                 KERNEL_MAX_TENSORS - 1);
        optarg = (char *)eq + 1;
      }
      if (optarg[0] == '\0')
        return dspk__sub_usage(ctx, "empty output file name");
      outs[nouts].index = (int)k;
      outs[nouts].spec = spec;
      outs[nouts].path = optarg;
      nouts++;
      break;
    }
    DSPK__SUB_OPT_CASES(ctx, opt, argv, json, opts);
    }
  }
  if (optind >= argc)
    return dspk__sub_usage(ctx, "missing SOURCE");
  /* SOURCE and the tensor arguments: standard input at most once. */
  if (dspk__sub_check_inputs(ctx, argv + optind, argc - optind) != 0)
    return DSPK__SUB_EXIT_USAGE;
  for (int i = 0, n = 0; i < nouts; i++) {
    n += strcmp(outs[i].path, "-") == 0;
    if (n > 1)
      return dspk__sub_usage(ctx, "standard output (-o -) can take one tensor");
    /* Two -o to one file, however spelled (./k.npy, a link, /dev/stdout
     * and -): which tensor it would hold is not clear. */
    for (int j = 0; j < i; j++) {
      if (strcmp(outs[i].path, outs[j].path) == 0)
        return dspk__sub_usage(ctx, "-o %s given twice (one file per tensor)",
                               outs[i].path);
      if (dspk__outfile_same(outs[i].path, outs[j].path))
        return dspk__sub_usage(ctx, "-o %s and -o %s are the same file (one file per "
                                    "tensor)", outs[j].path, outs[i].path);
    }
    if (n == 1 && strcmp(outs[i].path, "-") == 0 && isatty(STDOUT_FILENO) == 1)
      return dspk__sub_usage(ctx, "-o -: standard output is a terminal; "
                                  "redirect it to a file or a pipe");
  }
  /* --entry, --grid and --block default as the protocol's fields do
   * (docs/protocol.md, kernel: entry "main", grid and block 1): a GLSL
   * shader's entry is always main and its work-group size its own, so on
   * vulkan neither --entry nor --block is needed (probe 22 F2). */
  if (entry != NULL && entry[0] == '\0')
    return dspk__sub_usage(ctx, "--entry \"\": the name is empty (leave --entry out for "
                                "main; a GLSL shader's is main)");
  if (argc - optind - 1 > DSPK_KERNEL_MAX_ARGS)
    return dspk__sub_usage(ctx, "more than %d kernel arguments",
                           DSPK_KERNEL_MAX_ARGS);
  {
    /* SOURCE and the tensors are read, and the result lines (or a tensor)
     * go to standard output, only when the standard streams are there. */
    const char *paths[KERNEL_MAX_TENSORS];
    for (int i = 0; i < nouts; i++)
      paths[i] = outs[i].path;
    if (dspk__sub_check_std(ctx, true, argv + optind, argc - optind, paths, nouts) != 0)
      return DSPK__SUB_EXIT_FAIL;
  }

  dspk_task_init(&t, DSPK_OP_KERNEL);
  /* Arguments: tensors first become inputs, scalars stay scalars. */
  for (int i = optind + 1; i < argc; i++) {
    const char *a = argv[i];
    dspk_karg *k = &t.kernel.args[t.kernel.nargs];
    rc = parse_scalar(ctx, a, k);
    if (rc == 0) {
      t.kernel.nargs++;
      continue;
    }
    if (rc != 1) {
      status = rc;
      goto out;
    }
    if (ntens >= KERNEL_MAX_TENSORS) {
      status = dspk__sub_usage(ctx, "more than %d tensor arguments",
                               KERNEL_MAX_TENSORS);
      goto out;
    }
    if (strncmp(a, "zeros:", 6) == 0) {
      rc = parse_zeros(ctx, a, &tens[ntens]);
      if (rc != 0) {
        status = rc;
        goto out;
      }
    } else {
      rc = dspk__npy_input(a, &tens[ntens], err, sizeof err);
      if (rc < 0) {
        dspk__sub_fail(ctx, rc, "%s", err);
        goto out;
      }
    }
    {
      int64_t shape[DSPK_MAX_RANK];
      for (int d = 0; d < tens[ntens].rank; d++)
        shape[d] = (int64_t)tens[ntens].shape[d];
      dspk_tensor_inline(&tin[ntens], tens[ntens].dtype,
                         (unsigned)tens[ntens].rank, shape, tens[ntens].data);
    }
    tnames[ntens] = argv[i]; /* the daemon's "input N" */
    k->kind = DSPK_KARG_TENSOR;
    k->v.tensor = ntens++;
    t.kernel.nargs++;
  }
  for (int i = 0, next = 0; i < nouts; i++) {
    if (outs[i].index < 0)
      outs[i].index = next;
    next = outs[i].index + 1;
    if (outs[i].index >= ntens) {
      status = dspk__sub_usage(ctx, "-o %s: there is no tensor argument %d",
                               outs[i].spec, outs[i].index);
      goto out;
    }
    /* A dtype no .npy holds (bf16) is refused before any work, not after
     * the kernel ran. */
    char why[128];
    if (dspk__npy_writable(tens[outs[i].index].dtype, why, sizeof why) < 0) {
      status = dspk__sub_fail(ctx, DSPK_EDTYPE, "-o %s: tensor argument %d (%s): %s "
                              "(without -o its values are shown)", outs[i].spec,
                              outs[i].index, tnames[outs[i].index], why);
      goto out;
    }
    /* One tensor, one file: a result line per saved tensor names it. */
    for (int j = 0; j < i; j++)
      if (outs[j].index == outs[i].index) {
        status = dspk__sub_usage(ctx, "-o %s and -o %s both save tensor argument %d "
                                 "(one file per tensor)", outs[j].spec, outs[i].spec,
                                 outs[i].index);
        goto out;
      }
  }
  if (read_source(ctx, argv[optind], &src, &srclen) != 0)
    goto out;
  /* The daemon returns the results in the tensors: a kernel without one
   * could return nothing (and the daemon refuses it, in its own words). */
  if (ntens == 0) {
    status = dspk__sub_usage(ctx, "no tensor argument (a kernel writes its results into "
                                  "its tensors: give a FILE.npy or zeros:DTYPE:SHAPE)");
    goto out;
  }
  t.kernel.lang = lang ? lang : lang_from_path(argv[optind]);
  t.kernel.source = src;
  t.kernel.source_len = srclen;
  t.kernel.entry = entry;
  memcpy(t.kernel.grid, grid, sizeof grid);
  memcpy(t.kernel.block, block, sizeof block);
  t.kernel.shared = (uint32_t)shared;
  t.inputs = tin;
  t.ninputs = (unsigned)ntens;
  ctx->inputs = tnames;
  ctx->ninputs = ntens;
  t.device = device;

  /* The outputs exist (as temporaries) before the kernel runs. */
  for (int i = 0; i < nouts; i++)
    if ((status = dspk__sub_open_output(ctx, outs[i].path, &ofs[i])) != 0)
      goto out;
  status = DSPK__SUB_EXIT_FAIL;
  if (dspk__sub_connect(ctx) != 0 || kernel_fits(ctx, tens, ntens, &t) != 0)
    goto out;
  for (int i = 0; i < ntens; i++) /* sent from their files (ops.c, run_task) */
    if (tens[i].map)
      (void)dspk_file_data(ctx->client, tens[i].map, tens[i].map_len, tens[i].map_fd, 0);
  rc = dspk_run(ctx->client, &t, &res);
  if (rc < 0) {
    dspk__sub_fail_inputs(ctx, rc, tens, tnames, ntens, -1);
    goto out;
  }
  for (int i = 0; i < nouts; i++) {
    const dspk_tensor *o;
    if ((unsigned)outs[i].index >= res.nout || res.out[outs[i].index].is_ref) {
      dspk__sub_fail(ctx, DSPK_EPROTO, "the daemon returned no tensor %d",
                     outs[i].index);
      goto out_res;
    }
    o = &res.out[outs[i].index];
    rc = dspk__sub_save(o, &ofs[i], outs[i].path, err, sizeof err);
    if (rc < 0) {
      dspk__sub_fail(ctx, rc, "%s", err);
      goto out_res;
    }
    saved[outs[i].index] = outs[i].path;
  }
  {
    /* The report goes to stdout, unless a tensor itself does; with -o
     * only the saved tensors are reported. */
    FILE *f = stdout;
    for (int i = 0; i < nouts; i++)
      if (ofs[i].to_stdout)
        f = stderr;
    if (json) {
      clearerr(f);
      errno = 0;
      dspk__sub_json_result(f, &res, saved);
      if ((status = dspk__sub_json_written(ctx, f)) != DSPK__SUB_EXIT_OK)
        goto out_res;
    } else {
      for (unsigned i = 0; i < res.nout; i++) {
        if (nouts > 0 && saved[i] == NULL)
          continue;
        fprintf(f, "tensor %u: ", i);
        dspk__sub_print_summary(f, &res, &res.out[i], saved[i]);
      }
      if (res.nout == 0) {
        char tm[32];
        fprintf(f, "ran on %s", dspk__sub_esc(res.device));
        if (res.time_us > 0)
          fprintf(f, ", %s", dspk__sub_fmt_time(res.time_us, tm, sizeof tm));
        fputc('\n', f);
      }
    }
  }
  status = DSPK__SUB_EXIT_OK;
out_res:
  dspk_result_free(&res);
out:
  free(src);
  for (int i = 0; i < KERNEL_MAX_TENSORS; i++) {
    dspk__outfile_abort(&ofs[i]); /* nothing left when saved */
    dspk__npy_free(&tens[i]);
  }
  return status;
}
