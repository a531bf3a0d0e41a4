/*
 * Devices: at start the daemon probes every backend (those --backends
 * selects), lists each device it offers, and has the scheduler
 * (daemon/sched.c) start one runner per device, which opens it; the start
 * waits until each opened.  Also the device lookups (by id; "any", which
 * routes by the devices' caps) and the backends' shutdown after every
 * runner was joined.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/dspkd.h"
#include "daemon/log.h"
#include "daemon/sched.h"

#define MAX_PROBE 16

static void log_raw_kernels(struct dspkd *d);

static void add_unavailable(struct dspkd *d, const char *backend, const char *reason) {
  struct unavailable *u;
  if (d->nunavail >= DSPKD_MAX_UNAVAILABLE)
    return;
  u = &d->unavail[d->nunavail++];
  snprintf(u->backend, sizeof u->backend, "%s", backend);
  snprintf(u->reason, sizeof u->reason, "%s", reason);
}

/* 1 when name is in the comma list (or the list is NULL/empty). */
static bool selected(const char *list, const char *name) {
  size_t n = strlen(name);
  if (!list || !*list)
    return true;
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && memcmp(p, name, n) == 0)
      return true;
    p += len;
    if (*p == ',')
      p++;
  }
  return false;
}

/* Whether the backends list names the backend explicitly (no list: every
 * backend is merely tried). */
static bool asked(const char *list, const char *name) {
  return list && *list && selected(list, name);
}

static bool built(const char *name, size_t len) {
  for (int i = 0; dspk__backends[i]; i++)
    if (strlen(dspk__backends[i]->name) == len && memcmp(dspk__backends[i]->name, name, len) == 0)
      return true;
  return false;
}

static int check_backend_list(const char *list) {
  if (!list)
    return 0;
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    bool known = false;
    for (int i = 0; dspk__backends[i]; i++)
      if (strlen(dspk__backends[i]->name) == len &&
          memcmp(dspk__backends[i]->name, p, len) == 0)
        known = true;
    /* A backend dspk knows but this build lacks is listed as unavailable. */
    for (int i = 0; !known && dspk__known_backends[i]; i++)
      if (strlen(dspk__known_backends[i]) == len &&
          memcmp(dspk__known_backends[i], p, len) == 0)
        known = true;
    if (!known && len > 0) {
      char have[128] = "";
      size_t n = 0;
      for (int i = 0; dspk__backends[i] && n < sizeof have; i++) {
        int w = snprintf(have + n, sizeof have - n, "%s%s", i ? ", " : "",
                         dspk__backends[i]->name);
        if (w < 0)
          break;
        n += (size_t)w;
      }
      dspkd_error("--backends: unknown backend \"%.*s\" (this build has: %s)", (int)len, p,
                  have);
      return DSPK_EINVAL;
    }
    p += len;
    if (*p == ',')
      p++;
  }
  return 0;
}

int dspkd_devices_start(struct dspkd *d) {
  int err;

  err = check_backend_list(d->cfg.backends);
  if (err < 0)
    return err;
  for (int i = 0; dspk__known_backends[i]; i++) {
    const char *name = dspk__known_backends[i];
    if (built(name, strlen(name)))
      continue;
    add_unavailable(d, name, "not built into this dspkd");
    /* Asked for by name: say so at the start, not at the first task. */
    if (asked(d->cfg.backends, name))
      dspkd_warn("backend %s was asked for (backends=%s) but this dspkd was built without "
                 "it: no %s devices", name, d->cfg.backends, name);
  }
  for (int b = 0; dspk__backends[b]; b++) {
    const struct dspk__backend *be = dspk__backends[b];
    struct dspk__devinfo info[MAX_PROBE];
    char why[224] = "";
    int n;

    if (!selected(d->cfg.backends, be->name)) {
      add_unavailable(d, be->name, "not selected by --backends");
      continue;
    }
    memset(info, 0, sizeof info);
    n = be->probe(info, MAX_PROBE, why, sizeof why);
    if (n <= 0 && asked(d->cfg.backends, be->name)) {
      dspkd_warn("backend %s was asked for (backends=%s) but has no device: %s; tasks "
                 "for %s devices fail with ENODEV", be->name, d->cfg.backends,
                 why[0] ? why : "none found", be->name);
    } else if (n <= 0) {
      dspkd_info("backend %s: no devices: %s", be->name, why[0] ? why : "none found");
    }
    if (n <= 0) {
      add_unavailable(d, be->name, why[0] ? why : (n < 0 ? dspk__strerror(n) : "no device"));
      continue;
    }
    if (n > MAX_PROBE)
      n = MAX_PROBE;
    for (int i = 0; i < n && d->ndevs < DSPKD_MAX_DEVICES; i++) {
      struct device *dev = &d->devs[d->ndevs];
      dev->d = d;
      dev->idx = d->ndevs;
      dev->be = be;
      dev->bindex = i;
      dev->info = info[i];
      snprintf(dev->id, sizeof dev->id, "%s:%d", be->name, i);
      pthread_mutex_init(&dev->mu, NULL);
      pthread_cond_init(&dev->cv, NULL);
      d->ndevs++;
    }
  }

  for (int i = 0; i < d->ndevs; i++)
    dspkd_sched_start(&d->devs[i]);

  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    char reason[320];
    pthread_mutex_lock(&dev->mu);
    while (dev->open_state == 0)
      pthread_cond_wait(&dev->cv, &dev->mu);
    pthread_mutex_unlock(&dev->mu);
    if (dev->open_state == 1) {
      dspkd_info("%s: %s (%s, %s)", dev->id, dev->info.name, dev->info.type,
                 dev->info.arch);
      continue;
    }
    if (dev->thread_started && !dev->joined) {
      pthread_join(dev->thread, NULL);
      dev->joined = true;
    }
    snprintf(reason, sizeof reason, "%s: cannot open: %s", dev->id, dev->open_err);
    dspkd_warn("%s", reason);
    add_unavailable(d, dev->be->name, reason);
  }
  log_raw_kernels(d);
  return 0;
}

/* Appends ", id" (the first without the comma) to buf[len]. */
static void list_add(char *buf, size_t len, const char *id) {
  size_t at = strlen(buf);
  if (at < len)
    snprintf(buf + at, len - at, "%s%s", at ? ", " : "", id);
}

/* The devices that run raw kernels, said once at the start (raw_kernels
 * takes effect only then), and a warning for each id raw_kernels lists
 * that names no device open here, or a device whose backend runs no raw
 * kernels (cpu:0): a typo (cuda:O for cuda:0), a device gone or a device
 * that cannot run them would otherwise change which devices run them
 * (turning them off on every other one) without a word. */
static void log_raw_kernels(struct dspkd *d) {
  const char *s = d->cfg.raw_kernels ? d->cfg.raw_kernels : "all";
  char on[DSPKD_MAX_DEVICES * 16] = "", off[DSPKD_MAX_DEVICES * 16] = "";

  for (int i = 0; i < d->ndevs; i++) {
    const struct device *dev = &d->devs[i];
    if (dev->open_state != 1)
      continue;
    if (dev->caps.dtypes[DSPK_OP_KERNEL])
      list_add(on, sizeof on, dev->id);
    else if (dev->kernels_off)
      list_add(off, sizeof off, dev->id);
  }
  dspkd_info("raw kernels: %s%s%s%s (raw_kernels = %s)", on[0] ? "run on " : "run on no device",
             on, off[0] ? "; turned off on " : "", off, s);
  if (strcmp(s, "all") == 0 || strcmp(s, "none") == 0)
    return;
  for (const char *p = s; *p;) {
    size_t n = strcspn(p, ",");
    struct device *dev = dspkd_device_find(d, p, n);
    if (!dev)
      dspkd_warn("raw_kernels: %.*s names no device open here: it runs nothing", (int)n, p);
    else if (!dev->caps.dtypes[DSPK_OP_KERNEL] && !dev->kernels_off)
      dspkd_warn("raw_kernels: %.*s runs no raw kernels (the %s backend has none): naming it "
                 "runs nothing", (int)n, p, dev->be->name);
    p += n + (p[n] == ',');
  }
}

void dspkd_backends_shutdown(struct dspkd *d) {
  for (int b = 0; dspk__backends[b]; b++)
    if (dspk__backends[b]->shutdown && selected(d->cfg.backends, dspk__backends[b]->name))
      dspk__backends[b]->shutdown();
  for (int i = 0; i < d->ndevs; i++) {
    pthread_mutex_destroy(&d->devs[i].mu);
    pthread_cond_destroy(&d->devs[i].cv);
  }
}

struct device *dspkd_device_find(struct dspkd *d, const char *id, size_t len) {
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    if (dev->open_state == 1 && strlen(dev->id) == len && memcmp(dev->id, id, len) == 0)
      return dev;
  }
  return NULL;
}

/* Writes the UUID's hex digits, lowercase, without dashes ("" when none):
 * CUDA writes 8-4-4-4-12, Vulkan plain hex, for the same bytes. */
static void uuid_norm(const char *in, char *out, size_t outlen) {
  size_t n = 0;
  for (; *in && n + 1 < outlen; in++) {
    char ch = *in;
    if (ch == '-')
      continue;
    out[n++] = (ch >= 'A' && ch <= 'F') ? (char)(ch - 'A' + 'a') : ch;
  }
  out[n] = '\0';
}

/* Whether device i may take a task of connection c (NULL: any connection)
 * for "any": open, in c's Slurm job when it has one (or jobs are required),
 * and able to run op by its caps (op NULL: any device is). */
static bool candidate(struct dspkd *d, struct conn *c, const struct dspk__op *op, int i) {
  const struct device *dev = &d->devs[i];
  char msg[64];
  if (dev->open_state != 1)
    return false;
  if (c && (c->job || dspkd_jobs_required(d)) && !dspkd_job_dev_ok(c, dev))
    return false;
  return !op || dspk__caps_check(&dev->caps, op, dev->id, msg, sizeof msg) == 0;
}

/* 1 when an earlier candidate is the same hardware (one GPU seen through
 * CUDA and through Vulkan): "any" uses a GPU through its first backend
 * that can run the task. */
static bool seen_earlier(struct dspkd *d, struct conn *c, const struct dspk__op *op,
                         int idx) {
  char a[48], b[48];
  uuid_norm(d->devs[idx].info.uuid, a, sizeof a);
  if (!a[0])
    return false;
  for (int i = 0; i < idx; i++) {
    if (!candidate(d, c, op, i))
      continue;
    uuid_norm(d->devs[i].info.uuid, b, sizeof b);
    if (strcmp(a, b) == 0)
      return true;
  }
  return false;
}

struct device *dspkd_device_any(struct dspkd *d, struct conn *c, const struct dspk__op *op) {
  struct device *best = NULL, *cpu = NULL, *soft = NULL;
  uint64_t best_load = 0;
  for (int i = 0; i < d->ndevs; i++) {
    struct device *dev = &d->devs[i];
    uint64_t load;
    if (!candidate(d, c, op, i) || seen_earlier(d, c, op, i))
      continue;
    if (strcmp(dev->be->name, "cpu") == 0) {
      if (!cpu)
        cpu = dev;
      continue;
    }
    if (dev->info.software) {
      if (!soft)
        soft = dev;
      continue;
    }
    pthread_mutex_lock(&dev->mu);
    load = dev->queued + dev->running;
    pthread_mutex_unlock(&dev->mu);
    if (!best || load < best_load) {
      best = dev;
      best_load = load;
    }
  }
  return best ? best : cpu ? cpu : soft;
}

int dspkd_device_caps_check(const struct device *dev, const struct dspk__op *op, char *msg,
                            size_t len) {
  if (op->kind == DSPK_OP_KERNEL && dev->kernels_off)
    return dspk__fail(msg, len, DSPK_ENOTSUP, "kernel: raw kernels are turned off on %s "
                      "(raw_kernels in the daemon's configuration)", dev->id);
  return dspk__caps_check(&dev->caps, op, dev->id, msg, len);
}

void dspkd_device_none_why(struct dspkd *d, struct conn *c, const struct dspk__op *op,
                           char *buf, size_t len) {
  size_t at = 0;
  if (len)
    buf[0] = '\0';
  for (int i = 0; i < d->ndevs && at + 1 < len; i++) {
    char why[160];
    int w;
    if (!candidate(d, c, NULL, i) || dspkd_device_caps_check(&d->devs[i], op, why, sizeof why) == 0)
      continue;
    w = snprintf(buf + at, len - at, "%s%s", at ? "; " : "", why);
    if (w < 0)
      break;
    at += (size_t)w < len - at ? (size_t)w : len - at - 1;
  }
}

void dspkd_heap_warm(void) {
  size_t n = (size_t)DSPKD_HEAP_WARM_MB << 20;
  char *p = malloc(n);
  if (!p)
    return;
  /* volatile: the stores must happen, the point is touching the pages. */
  for (size_t i = 0; i < n; i += 4096)
    ((volatile char *)p)[i] = 0;
  free(p);
}
