/*
 * dspk-submit trace: records the jobs of the devices the daemon shows this
 * user (other users' jobs anonymous unless an admin asks) for
 * --seconds and writes it as Chrome trace-event JSON (dspk_trace), which
 * Perfetto (ui.perfetto.dev) and chrome://tracing open.  The output is
 * opened before the recording starts (a bad -o fails at once, not after
 * --seconds), as a temporary beside the target that is renamed over it
 * once the trace is written whole (outfile.h), so a reader never sees half
 * a trace and a failed write keeps the old file; "-o -" writes to stdout.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/submit/outfile.h"
#include "client/submit/submit.h"
#include "proto/dtype.h"

static const struct option trace_opts[] = {{"output", required_argument, NULL, 'o'},
    {"seconds", required_argument, NULL, 's'},
                                           DSPK__SUB_OPTS_END};
const dspk__sub_optset dspk__sub_trace_optsets[] = {
    {"trace", ":o:s:h", trace_opts, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL}};

int dspk__sub_trace(dspk__sub_ctx *ctx, int argc, char **argv) {
  const struct option *opts = trace_opts;
  const char *out = NULL;
  double seconds = 5;
  bool summary = false, seen_output = false, seen_seconds = false;
  char *json = NULL, err[512], secs[40];
  dspk__outfile of;
  size_t n;
  int opt, rc;

  while ((opt = getopt_long(argc, argv, dspk__sub_trace_optsets[0].shorts, opts, NULL)) != -1) {
    switch (opt) {
    case 'o':
      if ((rc = dspk__sub_once(ctx, &seen_output, opt, argv)) != 0)
        return rc;
      out = optarg;
      break;
    case 's':
      if ((rc = dspk__sub_once(ctx, &seen_seconds, opt, argv)) != 0)
        return rc;
      if (dspk__sub_parse_double(optarg, &seconds) < 0 || !(seconds > 0 && seconds <= 600))
        return dspk__sub_usage(ctx, "bad --seconds '%s' (want more than 0, at most 600)",
                               dspk__sub_arg(optarg));
      break;
    DSPK__SUB_OPT_CASES(ctx, opt, argv, summary, opts);
    }
  }
  if ((rc = dspk__sub_end_args(ctx, argc, argv)) != 0)
    return rc;
  /* N as given: the fewest significant digits that read back as it (the
   * one float rule, proto/dtype.h), not %g's six ("1" for 1.0000001). */
  dspk__float_str(secs, sizeof secs, seconds, false);
  if (!out)
    return dspk__sub_usage(ctx, "missing -o FILE (- for standard output)");
  if (summary && strcmp(out, "-") == 0)
    return dspk__sub_usage(ctx, "--json prints a summary: it needs -o FILE, not -");
  /* Standard output is written by -o - (or another name of it) and by
   * --json's summary; -o FILE alone writes nothing there. */
  if ((rc = dspk__sub_check_std(ctx, summary || strcmp(out, "-") == 0 ||
                                         dspk__fd_alias(out) == STDOUT_FILENO,
                                NULL, 0,
                                &out, 1)) != 0)
    return rc;
  if ((rc = dspk__sub_output_dir(ctx, out)) != 0)
    return rc;
  rc = dspk__outfile_open(&of, out, err, sizeof err);
  if (rc < 0)
    return dspk__sub_fail(ctx, rc, "%s: %s",
                          strcmp(out, "-") == 0 ? "<stdout>" : dspk__sub_arg(out), err);
  if (summary && of.to_stdout) {
    dspk__outfile_abort(&of);
    return dspk__sub_usage(ctx, "--json prints a summary: it needs -o FILE, not standard output");
  }
  rc = dspk__sub_connect(ctx);
  if (rc != 0) {
    dspk__outfile_abort(&of);
    return rc;
  }
  if (strcmp(out, "-") != 0 && isatty(STDERR_FILENO))
    fprintf(stderr, "dspk-submit: trace: recording for %s s...\n", secs);
  rc = dspk_trace(ctx->client, seconds, &json);
  if (rc < 0) {
    dspk__outfile_abort(&of);
    return dspk__sub_fail_client(ctx, rc);
  }
  /* Written as the .npy outputs are, named as they are (<stdout> for -). */
  n = strlen(json);
  if (strcmp(out, "-") == 0) {
    if (fwrite(json, 1, n, stdout) != n || fflush(stdout) != 0) {
      int e = errno;
      dspk_free(json);
      return dspk__sub_fail(ctx, DSPK_EIO, "<stdout>: %s", strerror(e ? e : EIO));
    }
  } else if (dspk__outfile_write(&of, json, n) < 0 ||
             (rc = dspk__outfile_commit(&of, err, sizeof err)) < 0) {
    if (of.fd >= 0) {
      snprintf(err, sizeof err, "%s", strerror(errno));
      dspk__outfile_abort(&of);
      rc = DSPK_EIO;
    }
    dspk_free(json);
    return dspk__sub_fail(ctx, rc, "%s: %s", dspk__sub_arg(out), err);
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
    printf(",\"seconds\":%s,\"jobs\":%llu,\"dropped\":%llu}\n", secs, jobs, dropped);
  }
  dspk_free(json);
  return DSPK__SUB_EXIT_OK;
}
