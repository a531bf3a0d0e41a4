/*
 * dspk-submit job register|end: the admin side of Slurm jobs
 * (docs/cluster.md), what the prolog and the epilog that the packages
 * install call.  --job defaults to $SLURM_JOB_ID and --uid to
 * $SLURM_JOB_UID, which Slurm sets in both.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>

#include "client/submit/submit.h"
#include "proto/units.h"

#define MAX_UUIDS DSPK__JOB_MAX_UUIDS /* job.register's devices (proto/units.h) */

/* A decimal job id or uid from an option or the environment, at most max,
 * without a leading zero, as $SLURM_JOB_ID, $SLURM_JOB_UID, $DSPK_JOB and
 * the daemon's state file have them.  A job id (job true), as dspkd
 * --end-job and hello take it, is 1 or more ("043" would be job 43 here and
 * no job there); a uid may be 0, but "00" and "0010" (8 in octal) are no
 * uid Slurm sets (outside probe 15 F3: "00" registered root's). */
static int parse_id(const char *s, bool job, unsigned long long max, unsigned long long *out) {
  char *end;
  if (!s || *s < (job ? '1' : '0') || *s > '9' || (s[0] == '0' && s[1]))
    return -1;
  errno = 0;
  *out = strtoull(s, &end, 10);
  return *end || errno == ERANGE || *out > max ? -1 : 0;
}

static int job_print(const dspk__sub_ctx *ctx, char *text, bool json, const char *what,
                     unsigned long long job) {
  (void)ctx;
  if (json) {
    dspk__sub_put(stdout, text, DSPK__SUB_ESC_JSON);
    putchar('\n');
  } else {
    printf("job %llu: %s\n", job, what);
  }
  dspk_free(text);
  return DSPK__SUB_EXIT_OK;
}

/* Each subcommand takes its own options: end's --uid or --devices is one
 * of register's, refused (docs/cli.md). */
static const struct option register_opts[] = {{"job", required_argument, NULL, 'J'},
    {"uid", required_argument, NULL, 'u'},
    {"devices", required_argument, NULL, 'D'},
                                              DSPK__SUB_OPTS_END};
static const struct option end_opts[] = {{"job", required_argument, NULL, 'J'},
                                         DSPK__SUB_OPTS_END};
const dspk__sub_optset dspk__sub_job_optsets[] = {
    {"job register", ":h", register_opts, NULL, NULL, NULL},
    {"job end", ":h", end_opts, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL}};

int dspk__sub_job(dspk__sub_ctx *ctx, int argc, char **argv) {
  const char *jobs = getenv("SLURM_JOB_ID"), *uids = getenv("SLURM_JOB_UID");
  const char *devs = NULL, *uuids[MAX_UUIDS];
  char devbuf[4096], *text = NULL;
  unsigned long long job, uid = 0;
  size_t n = 0;
  bool json = false, reg, seen_job = false, seen_uid = false, seen_devices = false;
  int opt, rc;

  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
      return dspk__sub_help(ctx);
  if (argc < 2)
    return dspk__sub_usage(ctx, "missing SUBCOMMAND (register, end)");
  if ((rc = dspk__sub_before_subcommand(ctx, argc, argv)) >= 0)
    return rc;
  if (strcmp(argv[1], "register") == 0)
    reg = true;
  else if (strcmp(argv[1], "end") == 0)
    reg = false;
  else
    return dspk__sub_usage(ctx, "unknown subcommand '%s' (want register or end)",
                           dspk__sub_arg(argv[1]));
  ctx->sub = argv[1];
  const dspk__sub_optset *set = &dspk__sub_job_optsets[reg ? 0 : 1];
  const struct option *opts = set->opts;
  argc--;
  argv++;
  while ((opt = getopt_long(argc, argv, set->shorts, opts, NULL)) != -1) {
    switch (opt) {
    case 'J':
      if ((rc = dspk__sub_once(ctx, &seen_job, opt, argv)) != 0)
        return rc;
      jobs = optarg;
      break;
    case 'u':
      if ((rc = dspk__sub_once(ctx, &seen_uid, opt, argv)) != 0)
        return rc;
      uids = optarg;
      break;
    case 'D':
      if ((rc = dspk__sub_once(ctx, &seen_devices, opt, argv)) != 0)
        return rc;
      devs = optarg;
      break;
    DSPK__SUB_OPT_CASES(ctx, opt, argv, json, opts);
    }
  }
  if ((rc = dspk__sub_end_args(ctx, argc, argv)) != 0)
    return rc;
  /* A value that is there but no number is named as given, with where it
   * came from; "is needed" is for none at all. */
  if (!jobs || (!*jobs && !seen_job))
    return dspk__sub_usage(ctx, "--job: a Slurm job id (default $SLURM_JOB_ID) is needed");
  if (parse_id(jobs, true, UINT64_MAX, &job) != 0)
    return dspk__sub_usage(ctx, "bad %s '%s' (want a Slurm job id, a decimal number from 1 "
                           "to %llu without leading zeros, signs or blanks)",
                           seen_job ? "--job" : "$SLURM_JOB_ID", dspk__sub_arg(jobs),
                           (unsigned long long)UINT64_MAX);
  if (reg && (!uids || (!*uids && !seen_uid)))
    return dspk__sub_usage(ctx, "--uid: the job's uid (default $SLURM_JOB_UID) is needed");
  if (reg && parse_id(uids, false, 0xfffffffeULL, &uid) != 0)
    return dspk__sub_usage(ctx, "bad %s '%s' (want a uid, a decimal number from 0 to "
                           "4294967294 without leading zeros, signs or blanks)",
                           seen_uid ? "--uid" : "$SLURM_JOB_UID", dspk__sub_arg(uids));
  if (devs) {
    if (strlen(devs) >= sizeof devbuf)
      return dspk__sub_usage(ctx, "--devices: longer than %zu bytes (%zu bytes; at most %d "
                                  "UUIDs)", sizeof devbuf - 1, strlen(devs), MAX_UUIDS);
    strcpy(devbuf, devs);
    /* Comma separated (spaces around an item allowed); an empty item is a
     * mistake ("a,,b", a trailing comma), not skipped.  An empty whole
     * value lists no GPU (the cpu only), as the prolog passes it. */
    for (char *p = devs[strspn(devs, " ")] ? devbuf : NULL, *t; p != NULL;) {
      t = strsep(&p, ",");
      size_t len;
      t += strspn(t, " ");
      len = strcspn(t, " ");
      /* Items counted from 1, as a person reads the list. */
      if (len == 0)
        return dspk__sub_usage(ctx, "--devices '%s': item %d is empty (want UUID,UUID,... "
                                    "with no empty item)", dspk__sub_arg(devs), (int)n + 1);
      if (t[len + strspn(t + len, " ")] != '\0')
        return dspk__sub_usage(ctx, "--devices '%s': item %d '%s' holds a blank (want "
                                    "UUID,UUID,...; one UUID an item)", dspk__sub_arg(devs),
                               (int)n + 1, dspk__sub_arg(t));
      t[len] = '\0';
      /* The daemon's rule (proto/units.c), checked before connecting: a
       * value that is no UUID is a bad command line, as a bad --job is. */
      char digits[DSPK__UUID_LEN], why[64];
      if (dspk__uuid_parse(t, len, digits, why, sizeof why) != 0)
        return dspk__sub_usage(ctx, "--devices '%s': item %d '%s' is not a device UUID (want "
                                    "hex digits and dashes, after an optional GPU- prefix): "
                                    "%s", dspk__sub_arg(devs), (int)n + 1, dspk__sub_arg(t),
                               why);
      if (n == MAX_UUIDS)
        return dspk__sub_usage(ctx, "--devices: at most %d UUIDs", MAX_UUIDS);
      uuids[n++] = t;
    }
  }
  rc = dspk__sub_check_std(ctx, true, NULL, 0, NULL, 0);
  if (rc == 0)
    rc = dspk__sub_connect(ctx);
  if (rc != 0)
    return rc;
  if (reg)
    rc = dspk_job_register(ctx->client, job, (uint32_t)uid, uuids, n, &text);
  else
    rc = dspk_job_end(ctx->client, job, &text);
  if (rc < 0)
    return dspk__sub_fail_client(ctx, rc);
  return job_print(ctx, text, json,
                   reg ? "registered"
                   : strstr(text, "\"ended\":false") ? "not registered on this node"
                                                     : "ended",
                   job);
}
