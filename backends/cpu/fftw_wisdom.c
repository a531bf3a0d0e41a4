/*
 * FFTW wisdom as cache blobs (see fftw_wisdom.h).  The process remembers
 * the hash of the wisdom text it last loaded or stored per precision, so
 * saving after every plan writes to SQLite only when FFTW learnt something.
 * Those hashes are written under the caller's FFTW lock, like FFTW itself,
 * and are atomic because dspk__fftw_wisdom_used reads them without it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fftw3.h>

#include "backends/cpu/fftw_wisdom.h"

static pthread_once_t model_once = PTHREAD_ONCE_INIT;
static char model[128];
/* wisdom_hash() of the text last loaded or stored, per precision (0: none) */
static _Atomic uint64_t last_hash[2];

static void read_model(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  snprintf(model, sizeof model, "unknown");
  if (!f)
    return;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    const char *colon = strchr(line, ':');
    if (!colon)
      break;
    colon++;
    while (*colon == ' ' || *colon == '\t')
      colon++;
    snprintf(model, sizeof model, "%s", colon);
    size_t n = strlen(model);
    while (n && (model[n - 1] == '\n' || model[n - 1] == ' '))
      model[--n] = '\0';
    break;
  }
  fclose(f);
}

static int cmp_line(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Hashes the set of lines of a wisdom text.  FFTW exports its entries in
 * hash-table order, which changes between processes for the same wisdom,
 * so the lines are sorted first.  Returns 0 when out of memory (never
 * equal to a remembered hash of real text, so the caller just writes). */
static uint64_t wisdom_hash(const char *text) {
  char *copy = strdup(text);
  size_t n = 0, cap = 64;
  char **lines = malloc(cap * sizeof *lines);
  uint64_t out = 0;
  if (!copy || !lines)
    goto done;
  for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l;
       l = strtok_r(NULL, "\n", &save)) {
    if (n == cap) {
      char **nl = realloc(lines, 2 * cap * sizeof *lines);
      if (!nl)
        goto done;
      lines = nl;
      cap *= 2;
    }
    lines[n++] = l;
  }
  qsort(lines, n, sizeof *lines, cmp_line);
  struct dspk__hash h;
  dspk__hash_init(&h);
  for (size_t i = 0; i < n; i++)
    dspk__hash_str(&h, lines[i]);
  out = (h.hi ^ h.lo) | 1;
done:
  free(lines);
  free(copy);
  return out;
}

/* See fftw_wisdom.h. */
int dspk__fftw_wisdom_name(int dbl, char *buf, size_t len) {
  pthread_once(&model_once, read_model);
  int n = snprintf(buf, len, "fftw-wisdom/%s/%s/%s", dbl ? "f64" : "f32",
                   dbl ? fftw_version : fftwf_version, model);
  if (n < 0 || (size_t)n >= len)
    return DSPK_ERANGE;
  return 0;
}

/* See fftw_wisdom.h. */
int dspk__fftw_wisdom_load(struct dspk__cache *c) {
  int imported = 0;
  if (!c)
    return 0;
  for (int dbl = 0; dbl < 2; dbl++) {
    char name[256];
    void *data = NULL;
    size_t len = 0;
    int rc = dspk__fftw_wisdom_name(dbl, name, sizeof name);
    if (rc < 0)
      return rc;
    rc = dspk__cache_blob_get(c, name, &data, &len);
    if (rc == DSPK_ENOENT)
      continue;
    if (rc < 0)
      return rc;
    /* Stored as text without its NUL; make it a C string. */
    char *text = realloc(data, len + 1);
    if (!text) {
      free(data);
      return DSPK_ENOMEM;
    }
    text[len] = '\0';
    int ok = dbl ? fftw_import_wisdom_from_string(text)
                 : fftwf_import_wisdom_from_string(text);
    if (ok) {
      imported++;
      last_hash[dbl] = wisdom_hash(text);
    } else {
      /* Stored by this FFTW version for this cpu (the name says so): wisdom
       * it refuses was damaged.  Dropped; the plans measure again. */
      (void)dspk__cache_blob_drop(c, name, "FFTW refused it as wisdom");
    }
    free(text);
  }
  return imported;
}

/* See fftw_wisdom.h. */
void dspk__fftw_wisdom_used(struct dspk__cache *c, int dbl) {
  char name[256];
  if (c && atomic_load(&last_hash[dbl != 0]) != 0 &&
      dspk__fftw_wisdom_name(dbl, name, sizeof name) == 0)
    dspk__cache_blob_used(c, name);
}

/* See fftw_wisdom.h. */
int dspk__fftw_wisdom_save(struct dspk__cache *c) {
  int written = 0;
  if (!c)
    return 0;
  for (int dbl = 0; dbl < 2; dbl++) {
    char name[256];
    int rc = dspk__fftw_wisdom_name(dbl, name, sizeof name);
    if (rc < 0)
      return rc;
    char *text = dbl ? fftw_export_wisdom_to_string()
                     : fftwf_export_wisdom_to_string();
    if (!text)
      return DSPK_ENOMEM;
    size_t len = strlen(text);
    uint64_t h = wisdom_hash(text);
    if (h != last_hash[dbl]) {
      rc = dspk__cache_blob_put(c, name, text, len);
      if (rc == 0) {
        last_hash[dbl] = h;
        written++;
      }
    }
    free(text);
    if (rc < 0)
      return rc;
  }
  return written;
}
