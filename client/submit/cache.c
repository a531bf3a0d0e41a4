/*
 * dspk-submit cache: the daemon's persistent cache (compiled kernels,
 * autotune decisions, blobs such as FFTW wisdom and Vulkan pipeline data).
 *
 * "cache clear [--kernels|--autotune|--blobs]" calls cache.clear through
 * dspk_cache_clear() (no flag: every kind) and prints "cleared KIND ..."; a
 * caller who is not an admin of the daemon (root, the daemon's user,
 * admin_users/admin_groups of dspkd.conf [policy]) gets EPERM.
 *
 * "cache stats" calls the cache.stats method.  With --json the answer is
 * printed as the library renders it; otherwise it is flattened into one
 * "path value" line per scalar ("kernels.entries 12"), which shows whatever
 * fields the daemon reports without this file knowing its schema.  The
 * flattener is a small recursive-descent walk over the library's JSON text
 * (objects, arrays, strings, numbers, literals), bounded in depth.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/submit/submit.h"

#define FLAT_MAX_DEPTH 16
#define FLAT_MAX_PATH 256

typedef struct flat {
  const char *p;
  int depth;
  char path[FLAT_MAX_PATH];
} flat;

static void skip_ws(flat *f) {
  while (*f->p == ' ' || *f->p == '\n' || *f->p == '\t' || *f->p == '\r')
    f->p++;
}

/* Four hex digits at p into *v; -1 when they are not. */
static int hex4(const char *p, unsigned *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    int d = p[i] >= '0' && p[i] <= '9'   ? p[i] - '0'
            : p[i] >= 'a' && p[i] <= 'f' ? p[i] - 'a' + 10
            : p[i] >= 'A' && p[i] <= 'F' ? p[i] - 'A' + 10
                                         : -1;
    if (d < 0)
      return -1;
    *v = *v << 4 | (unsigned)d;
  }
  return 0;
}

/* Reads a JSON string into out (cap bytes, cut at a character), its
 * escapes decoded (\uXXXX, surrogate pairs included, as UTF-8; a lone
 * surrogate as U+FFFD): the caller escapes what it prints by cli.md's one
 * rule (dspk__sub_esc). */
static int json_string(flat *f, char *out, size_t cap) {
  size_t n = 0;
  bool full = false;
  if (*f->p != '"')
    return -1;
  f->p++;
  while (*f->p && *f->p != '"') {
    char c = *f->p++, u8[4];
    size_t k = 1;
    unsigned cp, lo;
    u8[0] = c;
    if (c == '\\') {
      switch (c = *f->p++) {
      case 'b': u8[0] = '\b'; break;
      case 'f': u8[0] = '\f'; break;
      case 'n': u8[0] = '\n'; break;
      case 'r': u8[0] = '\r'; break;
      case 't': u8[0] = '\t'; break;
      case 'u':
        if (hex4(f->p, &cp) < 0)
          return -1;
        f->p += 4;
        if (cp >= 0xd800 && cp < 0xdc00 && f->p[0] == '\\' && f->p[1] == 'u' &&
            hex4(f->p + 2, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          f->p += 6;
        } else if (cp >= 0xd800 && cp < 0xe000) {
          cp = 0xfffd;
        }
        if (cp == 0) { /* no NUL in a C string: shown as cli.md shows C0 */
          memcpy(u8, "\\x00", 4);
          k = 4;
        } else if (cp < 0x80) {
          u8[0] = (char)cp;
        } else if (cp < 0x800) {
          u8[0] = (char)(0xc0 | cp >> 6);
          u8[1] = (char)(0x80 | (cp & 0x3f));
          k = 2;
        } else if (cp < 0x10000) {
          u8[0] = (char)(0xe0 | cp >> 12);
          u8[1] = (char)(0x80 | (cp >> 6 & 0x3f));
          u8[2] = (char)(0x80 | (cp & 0x3f));
          k = 3;
        } else {
          u8[0] = (char)(0xf0 | cp >> 18);
          u8[1] = (char)(0x80 | (cp >> 12 & 0x3f));
          u8[2] = (char)(0x80 | (cp >> 6 & 0x3f));
          u8[3] = (char)(0x80 | (cp & 0x3f));
          k = 4;
        }
        break;
      case '\0':
        return -1;
      default: /* \" \\ \/ */
        u8[0] = c;
        break;
      }
    }
    if (!full && n + k < cap) {
      memcpy(out + n, u8, k);
      n += k;
    } else {
      full = true; /* cut here, never inside or after a character left out */
    }
  }
  if (*f->p != '"')
    return -1;
  f->p++;
  out[n] = '\0';
  return 0;
}

static int flat_value(flat *f);

/* Appends ".key" (or "[i]") to the path for the duration of one value. */
static int flat_child(flat *f, const char *seg, bool index) {
  size_t len = strlen(f->path);
  int rc;
  if (index)
    snprintf(f->path + len, sizeof f->path - len, "[%s]", seg);
  else
    snprintf(f->path + len, sizeof f->path - len, "%s%s", len ? "." : "", seg);
  rc = flat_value(f);
  f->path[len] = '\0';
  return rc;
}

static int flat_value(flat *f) {
  char buf[512];
  skip_ws(f);
  if (++f->depth > FLAT_MAX_DEPTH)
    return -1;
  if (*f->p == '{') {
    f->p++;
    skip_ws(f);
    if (*f->p == '}') {
      f->p++;
      printf("%-36s {}\n", dspk__sub_esc(f->path));
    } else {
      for (;;) {
        skip_ws(f);
        if (json_string(f, buf, sizeof buf) < 0)
          return -1;
        skip_ws(f);
        if (*f->p++ != ':')
          return -1;
        if (flat_child(f, buf, false) < 0)
          return -1;
        skip_ws(f);
        if (*f->p == ',') {
          f->p++;
          continue;
        }
        if (*f->p++ != '}')
          return -1;
        break;
      }
    }
  } else if (*f->p == '[') {
    int i = 0;
    f->p++;
    skip_ws(f);
    if (*f->p == ']') {
      f->p++;
      printf("%-36s []\n", dspk__sub_esc(f->path));
    } else {
      for (;; i++) {
        snprintf(buf, sizeof buf, "%d", i);
        if (flat_child(f, buf, true) < 0)
          return -1;
        skip_ws(f);
        if (*f->p == ',') {
          f->p++;
          continue;
        }
        if (*f->p++ != ']')
          return -1;
        break;
      }
    }
  } else if (*f->p == '"') {
    if (json_string(f, buf, sizeof buf) < 0)
      return -1;
    printf("%-36s %s\n", dspk__sub_esc(f->path), dspk__sub_esc(buf));
  } else {
    const char *s = f->p;
    while (*f->p && !strchr(",}] \n\t\r", *f->p))
      f->p++;
    if (f->p == s)
      return -1;
    printf("%-36s %.*s\n", dspk__sub_esc(f->path), (int)(f->p - s), s);
  }
  f->depth--;
  return 0;
}

static int cache_stats(dspk__sub_ctx *ctx, int argc, char **argv) {
  bool json = false;
  char *text = NULL;
  int rc = dspk__sub_json_connect(ctx, argc, argv, &json);

  if (rc >= 0)
    return rc;
  rc = dspk_call_json(ctx->client, "cache.stats", &text);
  if (rc < 0)
    return dspk__sub_fail_client(ctx, rc);
  if (json) {
    dspk__sub_put(stdout, text, DSPK__SUB_ESC_JSON);
    putchar('\n');
  } else {
    flat f = {text, 0, ""};
    if (flat_value(&f) < 0) {
      dspk_free(text);
      return dspk__sub_fail(ctx, DSPK_EPROTO, "cannot read the answer");
    }
  }
  dspk_free(text);
  return DSPK__SUB_EXIT_OK;
}

static const struct option clear_opts[] = {{"kernels", no_argument, NULL, 'k'},
                                           {"autotune", no_argument, NULL, 'a'},
                                           {"blobs", no_argument, NULL, 'b'},
                                           DSPK__SUB_OPTS_END};
static const struct option stats_opts[] = {DSPK__SUB_OPTS_END}; /* dspk__sub_json_only's */
const dspk__sub_optset dspk__sub_cache_optsets[] = {
    {"cache stats", ":h", stats_opts, NULL, NULL, NULL},
    {"cache clear", ":h", clear_opts, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL}};

static int cache_clear(dspk__sub_ctx *ctx, int argc, char **argv) {
  const struct option *opts = clear_opts;
  unsigned kinds = 0, cleared = 0;
  bool json = false;
  int opt, rc;

  while ((opt = getopt_long(argc, argv, dspk__sub_cache_optsets[0].shorts, opts, NULL)) != -1) {
    switch (opt) {
    case 'k':
      kinds |= DSPK_CACHE_KERNELS;
      break;
    case 'a':
      kinds |= DSPK_CACHE_AUTOTUNE;
      break;
    case 'b':
      kinds |= DSPK_CACHE_BLOBS;
      break;
    DSPK__SUB_OPT_CASES(ctx, opt, argv, json, opts);
    }
  }
  if ((rc = dspk__sub_end_args(ctx, argc, argv)) != 0 ||
      (rc = dspk__sub_check_std(ctx, true, NULL, 0, NULL, 0)) != 0 ||
      (rc = dspk__sub_connect(ctx)) != 0)
    return rc;
  rc = dspk_cache_clear(ctx->client, kinds, &cleared);
  if (rc < 0)
    return dspk__sub_fail_client(ctx, rc);
  if (json) {
    const char *sep = "";
    printf("{\"cleared\":[");
    if (cleared & DSPK_CACHE_KERNELS) {
      printf("%s\"kernels\"", sep);
      sep = ",";
    }
    if (cleared & DSPK_CACHE_AUTOTUNE) {
      printf("%s\"autotune\"", sep);
      sep = ",";
    }
    if (cleared & DSPK_CACHE_BLOBS)
      printf("%s\"blobs\"", sep);
    printf("]}\n");
    return DSPK__SUB_EXIT_OK;
  }
  printf("cleared%s%s%s\n", cleared & DSPK_CACHE_KERNELS ? " kernels" : "",
         cleared & DSPK_CACHE_AUTOTUNE ? " autotune" : "",
         cleared & DSPK_CACHE_BLOBS ? " blobs" : "");
  return DSPK__SUB_EXIT_OK;
}

int dspk__sub_cache(dspk__sub_ctx *ctx, int argc, char **argv) {
  int rc;

  /* "cache SUB ...": SUB's own options start after it.  --help anywhere
   * wins, as for every other command. */
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
      return dspk__sub_help(ctx);
  if (argc < 2)
    return dspk__sub_usage(ctx, "missing SUBCOMMAND (stats, clear)");
  if ((rc = dspk__sub_before_subcommand(ctx, argc, argv)) >= 0)
    return rc;
  if (strcmp(argv[1], "stats") == 0) {
    ctx->sub = "stats";
    return cache_stats(ctx, argc - 1, argv + 1);
  }
  if (strcmp(argv[1], "clear") == 0) {
    ctx->sub = "clear";
    return cache_clear(ctx, argc - 1, argv + 1);
  }
  return dspk__sub_usage(ctx, "unknown subcommand '%s' (want stats or clear)",
                         dspk__sub_arg(argv[1]));
}
