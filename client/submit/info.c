/*
 * dspk-submit commands that ask the daemon about itself: ping (round-trip
 * timing with min/median/p99 like ping(8)), devices (the device list, and
 * with --all the backends that are unavailable and why) and status (the
 * daemon, its clients and its queues).  Each prints a human-readable table
 * by default and the daemon's answer as JSON with --json.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/submit/submit.h"

/* ---- ping ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v (n > 0), p in (0, 1]. */
static double percentile(const double *v, size_t n, double p) {
  size_t k = (size_t)ceil(p * (double)n);
  if (k < 1)
    k = 1;
  if (k > n)
    k = n;
  return v[k - 1];
}

static double median(const double *v, size_t n) {
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const struct option ping_opts[] = {{"count", required_argument, NULL, 'c'},
                                          {"size", required_argument, NULL, 's'},
                                          DSPK__SUB_OPTS_END};
#define PING_SHORTS ":c:s:h"
#define DEVICES_SHORTS ":ah"
/* devices takes --all; status the same table without it. */
static const struct option devices_opts[] = {{"all", no_argument, NULL, 'a'},
                                             DSPK__SUB_OPTS_END};
const dspk__sub_optset dspk__sub_info_optsets[] = {
    {"ping", PING_SHORTS, ping_opts, NULL, NULL, NULL},
    {"devices", DEVICES_SHORTS, devices_opts, NULL, NULL, NULL},
    {"status", ":h", devices_opts + 1, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL}};

int dspk__sub_ping(dspk__sub_ctx *ctx, int argc, char **argv) {
  const struct option *opts = ping_opts;
  long count = 0, size = 0;
  bool json = false, seen_count = false, seen_size = false;
  double *t = NULL;
  unsigned char *payload = NULL;
  int opt, rc, status = DSPK__SUB_EXIT_FAIL;
  char path[512];
  const char *where = ctx->socket;

  while ((opt = getopt_long(argc, argv, PING_SHORTS, opts, NULL)) != -1) {
    switch (opt) {
    case 'c':
      if ((rc = dspk__sub_once(ctx, &seen_count, opt, argv)) != 0)
        return rc;
      if (dspk__sub_parse_long(optarg, 1, 1000000, &count) < 0)
        return dspk__sub_usage(ctx, "bad --count '%s' (want a count, 1..1000000)",
                               dspk__sub_arg(optarg));
      break;
    case 's': {
      if ((rc = dspk__sub_once(ctx, &seen_size, opt, argv)) != 0)
        return rc;
      uint64_t v;
      if (dspk__sub_parse_size(optarg, 0, 64u << 20, &v) < 0)
        return dspk__sub_usage(ctx, "bad --size '%s' (want a size, 0..64M bytes: "
                                    DSPK__SIZE_UNITS ")",
                               dspk__sub_arg(optarg));
      size = (long)v;
      break;
    }
    DSPK__SUB_OPT_CASES(ctx, opt, argv, json, opts);
    }
  }
  if ((rc = dspk__sub_end_args(ctx, argc, argv)) != 0)
    return rc;
  if (where == NULL)
    where = dspk_default_socket(path, sizeof path) == 0 ? path : "dspkd";
  /* Before the first round trip, whose answer would have nowhere to go. */
  rc = dspk__sub_check_std(ctx, true, NULL, 0, NULL, 0);
  if (rc == 0)
    rc = dspk__sub_connect(ctx);
  if (rc != 0)
    return rc;
  /* A payload over what every ping of the run can carry (the later ones'
   * ids take more bytes), said in ping's terms before the first is sent. */
  if ((size_t)size > dspk_ping_max(ctx->client))
    return dspk__sub_fail(ctx, DSPK_ELIMIT, "-s %ld: a ping of %ld bytes with its framing "
                          "exceeds the daemon's %zu-byte message limit (max_message); %zu "
                          "bytes or less fit", size, size, dspk_max_message(ctx->client),
                          dspk_ping_max(ctx->client));

  size_t n = count > 0 ? (size_t)count : 1;
  t = malloc(n * sizeof *t);
  payload = calloc(1, size > 0 ? (size_t)size : 1);
  if (t == NULL || payload == NULL) {
    dspk__sub_fail(ctx, DSPK_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < (size_t)size; i++)
    payload[i] = (unsigned char)(i * 131u + 7u);
  for (size_t i = 0; i < n; i++) {
    double t0 = dspk__sub_now_us();
    rc = dspk_ping(ctx->client, payload, (size_t)size);
    if (rc < 0) {
      dspk__sub_fail_client(ctx, rc);
      goto out;
    }
    t[i] = dspk__sub_now_us() - t0;
  }
  qsort(t, n, sizeof *t, cmp_double);
  if (json) {
    printf("{\"count\":%zu,\"min_us\":%.3f,\"median_us\":%.3f,"
           "\"p99_us\":%.3f}\n",
           n, t[0], median(t, n), percentile(t, n, 0.99));
  } else if (count == 0) {
    printf("pong from %s: %ld bytes, time=%.1f us\n", dspk__sub_esc(where), size, t[0]);
  } else {
    printf("--- %s ping statistics ---\n", dspk__sub_esc(where));
    printf("%zu round trip%s, %ld bytes each, rtt min/median/p99 = "
           "%.1f/%.1f/%.1f us\n",
           n, n == 1 ? "" : "s", size, t[0], median(t, n), percentile(t, n, 0.99));
  }
  status = DSPK__SUB_EXIT_OK;
out:
  free(t);
  free(payload);
  return status;
}

/* ---- devices ---------------------------------------------------------- */

/* Formats bytes as "15.6 GiB" into buf. */
static const char *human_bytes(uint64_t b, char *buf, size_t cap) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  if (b == 0) {
    snprintf(buf, cap, "-");
    return buf;
  }
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

/* Simple flags-only option loop shared by devices and status: sets *json
 * and *all (when all != NULL).  Returns -1 to go on, else an exit status. */
static int flag_opts(dspk__sub_ctx *ctx, int argc, char **argv, bool *json,
                     bool *all) {
  const struct option *opts = all ? devices_opts : devices_opts + 1;
  int opt;
  while ((opt = getopt_long(argc, argv, all ? DEVICES_SHORTS : ":h", opts,
                            NULL)) != -1) {
    switch (opt) {
    case 'a':
      *all = true;
      break;
    DSPK__SUB_OPT_CASES(ctx, opt, argv, *json, opts);
    }
  }
  return dspk__sub_end_args(ctx, argc, argv) ? DSPK__SUB_EXIT_USAGE : -1;
}

int dspk__sub_devices(dspk__sub_ctx *ctx, int argc, char **argv) {
  dspk_device_list *l = NULL;
  bool json = false, all = false;
  char mem[32];
  int rc;

  rc = flag_opts(ctx, argc, argv, &json, &all);
  if (rc >= 0)
    return rc;
  rc = dspk__sub_check_std(ctx, true, NULL, 0, NULL, 0);
  if (rc == 0)
    rc = dspk__sub_connect(ctx);
  if (rc != 0)
    return rc;
  rc = dspk_devices(ctx->client, all, &l);
  if (rc < 0)
    return dspk__sub_fail_client(ctx, rc);
  if (json) {
    dspk__sub_put(stdout, l->json ? l->json : "{}", DSPK__SUB_ESC_JSON);
    putchar('\n');
    goto out;
  }
  /* The UUID (what job.register and nvidia-smi name a GPU by; "-" where
   * the backend has none, as the cpu) in a column as wide as the longest. */
  int uw = 4;
  for (size_t i = 0; i < l->ndevices; i++) {
    int n = (int)strlen(dspk__sub_esc(l->devices[i].uuid));
    uw = n > uw ? n : uw;
  }
  printf("%-10s %-8s %-10s %-*s %s\n", "ID", "TYPE", "MEMORY", uw, "UUID", "NAME");
  for (size_t i = 0; i < l->ndevices; i++) {
    const dspk_device *d = &l->devices[i];
    printf("%-10s %-8s %-10s %-*s %s%s%s%s\n", dspk__sub_esc(d->id), dspk__sub_esc(d->type),
           human_bytes(d->memory, mem, sizeof mem), uw,
           d->uuid[0] ? dspk__sub_esc(d->uuid) : "-", dspk__sub_esc(d->name),
           d->arch[0] ? " [" : "", dspk__sub_esc(d->arch), d->arch[0] ? "]" : "");
    if (d->software)
      printf("%-10s (software implementation)\n", "");
  }
  if (all) {
    if (l->nunavailable > 0)
      printf("\nunavailable backends:\n");
    for (size_t i = 0; i < l->nunavailable; i++)
      printf("  %-8s %s\n", dspk__sub_esc(l->unavailable[i].backend),
             dspk__sub_esc(l->unavailable[i].reason));
  }
out:
  dspk_device_list_free(l);
  return DSPK__SUB_EXIT_OK;
}

/* ---- status ------------------------------------------------------------ */

int dspk__sub_status(dspk__sub_ctx *ctx, int argc, char **argv) {
  dspk_status *s = NULL;
  bool json = false;
  int rc;

  rc = flag_opts(ctx, argc, argv, &json, NULL);
  if (rc >= 0)
    return rc;
  rc = dspk__sub_check_std(ctx, true, NULL, 0, NULL, 0);
  if (rc == 0)
    rc = dspk__sub_connect(ctx);
  if (rc != 0)
    return rc;
  /* The connection's Slurm job is decided by its first request that needs
   * a device (docs/protocol.md, "Slurm jobs"), which status is not: asking
   * for the devices first decides it, so that status names the job (self's
   * job) whose devices it lists.  A uid with several jobs that names none
   * is refused (EPERM): its job stays undecided, and the text says why.
   * Any other failure is left to status itself to answer (a connection
   * that broke fails it, with its own error). */
  char undecided[256] = "";
  dspk_device_list *dl = NULL;
  rc = dspk_devices(ctx->client, false, &dl);
  if (rc == DSPK_EPERM)
    snprintf(undecided, sizeof undecided, "%s", dspk_last_error(ctx->client));
  dspk_device_list_free(dl);
  rc = dspk_status_get(ctx->client, &s);
  if (rc < 0)
    return dspk__sub_fail_client(ctx, rc);
  if (json) {
    dspk__sub_put(stdout, s->json ? s->json : "{}", DSPK__SUB_ESC_JSON);
    putchar('\n');
    goto out;
  }
  printf("dspkd %s, pid %lld, up %.1f s, socket %s\n", dspk__sub_esc(s->version),
         (long long)s->pid, s->uptime_s, dspk__sub_esc(s->socket));
  /* This connection and its Slurm job (docs/cluster.md: in a job, status
   * shows the job's connections and devices; the devices below are those
   * this connection may use, its job's). */
  if (s->self >= 0) {
    const dspk_status_client *me = &s->clients[s->self];
    if (s->client_job[s->self])
      printf("this connection: client %llu, Slurm job %llu\n", (unsigned long long)me->id,
             (unsigned long long)s->client_job[s->self]);
    else if (undecided[0])
      printf("this connection: client %llu, Slurm job not decided (%s)\n",
             (unsigned long long)me->id, dspk__sub_esc(undecided));
    else
      printf("this connection: client %llu, no Slurm job\n", (unsigned long long)me->id);
  }
  printf("\n%zu client%s:\n", s->nclients, s->nclients == 1 ? "" : "s");
  printf("  %-6s %-8s %-6s %-6s %-8s %-8s %-20s %s\n", "ID", "PID", "UID", "GID",
         "INFLIGHT", "BUFFERS", "JOB", "NAME");
  for (size_t i = 0; i < s->nclients; i++) {
    const dspk_status_client *c = &s->clients[i];
    char job[24] = "-";
    if (s->client_job[i])
      snprintf(job, sizeof job, "%llu", (unsigned long long)s->client_job[i]);
    printf("  %-6llu %-8lld %-6lld %-6lld %-8llu %-8llu %-20s %s\n",
           (unsigned long long)c->id, (long long)c->pid, (long long)c->uid,
           (long long)c->gid, (unsigned long long)c->inflight,
           (unsigned long long)c->buffers, job, dspk__sub_esc(c->name));
  }
  /* A non-admin sees its own uid's connections; the rest only as a count. */
  if (s->connections > s->nclients) {
    unsigned long long more = (unsigned long long)(s->connections - s->nclients);
    printf("  and %llu connection%s of other users (not shown)\n", more,
           more == 1 ? "" : "s");
  }
  /* The Slurm jobs registered here that the caller may see (its uid's;
   * an admin every one); none: no section. */
  if (s->njobs) {
    printf("\n%zu Slurm job%s:\n", s->njobs, s->njobs == 1 ? "" : "s");
    printf("  %-20s %-10s %-5s %-11s %-8s %-8s %s\n", "JOB", "UID", "GPUS", "CONNECTIONS",
           "INFLIGHT", "BUFFERS", "STATE");
    for (size_t i = 0; i < s->njobs; i++) {
      const dspk_status_job *j = &s->jobs[i];
      printf("  %-20llu %-10lld %-5zu %-11llu %-8llu %-8llu %s\n", (unsigned long long)j->job,
             (long long)j->uid, j->ngpus, (unsigned long long)j->connections,
             (unsigned long long)j->inflight, (unsigned long long)j->buffers,
             j->ended ? "ending" : "registered");
    }
  }
  printf("\n%zu device%s:\n", s->ndevices, s->ndevices == 1 ? "" : "s");
  printf("  %-10s %-8s %-8s %-10s %s\n", "ID", "QUEUED", "RUNNING",
         "COMPLETED", "FAILED");
  for (size_t i = 0; i < s->ndevices; i++) {
    const dspk_status_device *d = &s->devices[i];
    printf("  %-10s %-8llu %-8llu %-10llu %llu\n", dspk__sub_esc(d->id),
           (unsigned long long)d->queued, (unsigned long long)d->running,
           (unsigned long long)d->completed, (unsigned long long)d->failed);
  }
out:
  dspk_status_free(s);
  return DSPK__SUB_EXIT_OK;
}
