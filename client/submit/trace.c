/*
 * dspk-submit trace: records every job on every device of the daemon for
 * --seconds and writes it as Chrome trace-event JSON (dspk_trace), which
 * Perfetto (ui.perfetto.dev) and chrome://tracing open.  The file is
 * written whole after the recording, to a temporary name beside it, then
 * renamed, so a reader never sees half a trace; "-o -" writes to stdout.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/submit/submit.h"

static int write_file(const char *path, const char *text) {
  char tmp[4096];
  FILE *f;
  size_t n = strlen(text);
  int k;

  if (strcmp(path, "-") == 0)
    return fwrite(text, 1, n, stdout) == n && fflush(stdout) == 0 ? 0 : -1;
  k = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  if (k < 0 || (size_t)k >= sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  f = fopen(tmp, "w");
  if (!f)
    return -1;
  if (fwrite(text, 1, n, f) != n || fclose(f) != 0) {
    int e = errno;
    unlink(tmp);
    errno = e;
    return -1;
  }
  if (rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    errno = e;
    return -1;
  }
  return 0;
}

int dspk__sub_trace(dspk__sub_ctx *ctx, int argc, char **argv) {
  static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                       {"seconds", required_argument, NULL, 's'},
                                       DSPK__SUB_OPTS_END};
  const char *out = NULL;
  double seconds = 5;
  bool summary = false;
  char *json = NULL;
  int opt, rc;

  while ((opt = getopt_long(argc, argv, ":o:s:h", opts, NULL)) != -1) {
    switch (opt) {
    case 'o':
      out = optarg;
      break;
    case 's':
      if (dspk__sub_parse_double(optarg, &seconds) < 0 || !(seconds > 0 && seconds <= 600))
        return dspk__sub_usage(ctx, "bad --seconds '%s' (want more than 0, at most 600)",
                               optarg);
      break;
    DSPK__SUB_OPT_CASES(ctx, opt, argv, summary);
    }
  }
  if ((rc = dspk__sub_end_args(ctx, argc, argv)) != 0)
    return rc;
  if (!out)
    return dspk__sub_usage(ctx, "missing -o FILE (- for standard output)");
  if (summary && strcmp(out, "-") == 0)
    return dspk__sub_usage(ctx, "--json prints a summary: it needs -o FILE, not -");
  rc = dspk__sub_connect(ctx);
  if (rc != 0)
    return rc;
  if (strcmp(out, "-") != 0 && isatty(STDERR_FILENO))
    fprintf(stderr, "dspk-submit: trace: recording for %g s...\n", seconds);
  rc = dspk_trace(ctx->client, seconds, &json);
  if (rc < 0)
    return dspk__sub_fail_client(ctx, rc);
  if (write_file(out, json) != 0) {
    int e = errno;
    dspk_free(json);
    return dspk__sub_fail(ctx, DSPK_EIO, "cannot write %s: %s", out, strerror(e));
  }
  if (summary) {
    /* The numbers of the trace's otherData (lib_observe.c writes it last). */
    const char *o = strstr(json, "\"otherData\":");
    unsigned long long jobs = 0, dropped = 0;
    if (o) {
      const char *p = strstr(o, "\"jobs\":"), *q = strstr(o, "\"dropped\":");
      if (p)
        jobs = strtoull(p + 7, NULL, 10);
      if (q)
        dropped = strtoull(q + 10, NULL, 10);
    }
    printf("{\"output\":");
    dspk__sub_json_str(stdout, out);
    printf(",\"seconds\":%g,\"jobs\":%llu,\"dropped\":%llu}\n", seconds, jobs, dropped);
  }
  dspk_free(json);
  return DSPK__SUB_EXIT_OK;
}
