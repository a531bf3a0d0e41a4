/*
 * Helpers shared by the Vulkan backend tests: open the first Vulkan device
 * through the backend table, move tensors in and out, run an op after
 * dspk__op_infer(), and compare against references computed in double
 * precision by naive loops in the tests themselves.
 */
#ifndef DSPK_TESTS_VULKAN_HARNESS_H
#define DSPK_TESTS_VULKAN_HARNESS_H

#include <complex.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"

extern const struct dspk__backend dspk__backend_vulkan;
#define VKB (&dspk__backend_vulkan)

/* A host tensor: values kept as complex double whatever the dtype. */
struct htensor {
  dspk_dtype dt;
  int rank;
  int64_t shape[DSPK_MAX_RANK];
  int64_t n;
  double complex *v;
};

/* A fresh path for a cache file from template path ("...XXXXXX"): made
 * unique by mkstemp, then removed so that the cache creates it.  0 or -1. */
static inline int h_cache_path(char *path) {
  int fd = mkstemp(path);
  if (fd < 0)
    return -1;
  close(fd);
  unlink(path);
  return 0;
}
/* Removes a cache file and SQLite's -wal and -shm files beside it. */
static inline void h_cache_unlink(const char *path) {
  char side[4096];
  unlink(path);
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
}

static uint64_t h_seed = 12345;
static inline double h_rand(void) { /* uniform in [-1, 1) */
  h_seed = h_seed * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(h_seed >> 11) / (double)(1ull << 52) - 1.0;
}
static inline int h_randint(int lo, int hi) {
  return lo + (int)((h_rand() + 1.0) / 2.0 * (hi - lo + 1)) % (hi - lo + 1);
}

static inline int h_cplx(dspk_dtype dt) { return dt == DSPK_C64 || dt == DSPK_C128; }

static inline struct htensor h_make(dspk_dtype dt, int rank, const int64_t *shape,
                                    int random) {
  struct htensor t = {.dt = dt, .rank = rank, .n = 1};
  for (int i = 0; i < rank; i++) {
    t.shape[i] = shape[i];
    t.n *= shape[i];
  }
  t.v = calloc(t.n ? (size_t)t.n : 1, sizeof *t.v);
  for (int64_t i = 0; random && i < t.n; i++) {
    double re = h_rand(), im = h_cplx(dt) ? h_rand() : 0;
    if (dt == DSPK_F32 || dt == DSPK_C64 || dt == DSPK_F16 || dt == DSPK_BF16) {
      re = (float)re;
      im = (float)im;
    }
    if (dt == DSPK_F16) /* exactly representable: multiples of 1/256 */
      re = round(re * 256) / 256;
    if (dt == DSPK_BF16)
      re = round(re * 64) / 64;
    t.v[i] = re + im * I;
  }
  return t;
}

static inline void h_free(struct htensor *t) {
  free(t->v);
  t->v = NULL;
}

static inline uint16_t h_f16(double x) { /* exact for the values above */
  if (x == 0)
    return 0;
  uint16_t s = x < 0 ? 0x8000 : 0;
  x = fabs(x);
  int e;
  double m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
  int E = e - 1 + 15;
  uint16_t mant = (uint16_t)((m * 2 - 1) * 1024 + 0.5);
  return s | (uint16_t)(E << 10) | mant;
}

/* Packs a host tensor into its dtype's bytes (malloc'd). */
static inline void *h_pack(const struct htensor *t, size_t *nbytes) {
  size_t es = dspk__dtype_size(t->dt);
  void *p = malloc(t->n * es + 16);
  for (int64_t i = 0; i < t->n; i++) {
    double re = creal(t->v[i]), im = cimag(t->v[i]);
    switch (t->dt) {
    case DSPK_F32: ((float *)p)[i] = (float)re; break;
    case DSPK_F64: ((double *)p)[i] = re; break;
    case DSPK_C64: ((float *)p)[2 * i] = (float)re; ((float *)p)[2 * i + 1] = (float)im; break;
    case DSPK_C128: ((double *)p)[2 * i] = re; ((double *)p)[2 * i + 1] = im; break;
    case DSPK_F16: ((uint16_t *)p)[i] = h_f16(re); break;
    case DSPK_BF16: {
      float f = (float)re;
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
      break;
    }
    default: break;
    }
  }
  *nbytes = t->n * es;
  return p;
}

static inline void h_unpack(struct htensor *t, const void *p) {
  for (int64_t i = 0; i < t->n; i++) {
    switch (t->dt) {
    case DSPK_F32: t->v[i] = ((const float *)p)[i]; break;
    case DSPK_F64: t->v[i] = ((const double *)p)[i]; break;
    /* (CMPLX: re + im * I would turn an infinite im into a NaN re) */
    case DSPK_C64: t->v[i] = CMPLX(((const float *)p)[2 * i], ((const float *)p)[2 * i + 1]); break;
    case DSPK_C128: t->v[i] = CMPLX(((const double *)p)[2 * i], ((const double *)p)[2 * i + 1]); break;
    default: break;
    }
  }
}

/* Uploads a host tensor into fresh device memory (at byte offset `pad`). */
static inline int h_upload(struct dspk__dev *d, const struct htensor *h, size_t pad,
                           struct dspk__tensor *t) {
  size_t nb;
  void *p = h_pack(h, &nb);
  struct dspk__mem *m;
  int r = VKB->alloc(d, nb + pad, &m);
  if (r == 0)
    r = VKB->write(d, m, pad, p, nb);
  free(p);
  if (r)
    return r;
  memset(t, 0, sizeof *t);
  t->dtype = h->dt;
  t->rank = h->rank;
  memcpy(t->shape, h->shape, sizeof t->shape);
  t->mem = m;
  t->offset = pad;
  return 0;
}

/* The input blocks the last h_run freed (for tests of a second free). */
static struct dspk__mem *h_freed[DSPK__OP_MAX_IN];
static int h_nfreed;

/* Runs op (inputs placed), allocating the outputs; reads them into out[]
 * (host tensors made here).  Frees every device block, the inputs' too, and
 * sets op's mem pointers to NULL: a block is freed once (backends/backend.h,
 * free), so the caller must not free them again; uploading new inputs into
 * op is fine.  Returns the run's result; msg gets the error text. */
static inline int h_run(struct dspk__dev *d, struct dspk__op *op, struct htensor *out,
                        char *msg, size_t msglen) {
  int r = dspk__op_infer(op, msg, msglen);
  if (r)
    return r;
  for (int i = 0; i < op->nout; i++) {
    struct dspk__tensor *t = &op->out[i];
    if ((r = VKB->alloc(d, dspk__tensor_nbytes(t), &t->mem)))
      return r;
    t->offset = 0;
  }
  struct dspk__opctx ctx = {.errmsg = msg, .errmsg_len = msglen};
  msg[0] = 0;
  r = VKB->run(d, op, &ctx);
  for (int i = 0; r == 0 && i < op->nout; i++) {
    struct dspk__tensor *t = &op->out[i];
    out[i] = h_make(t->dtype, t->rank, t->shape, 0);
    size_t nb = dspk__tensor_nbytes(t);
    void *p = malloc(nb + 16);
    r = VKB->read(d, t->mem, 0, p, nb);
    h_unpack(&out[i], p);
    free(p);
  }
  for (int i = 0; i < op->nout; i++) {
    VKB->free(d, op->out[i].mem);
    op->out[i].mem = NULL;
  }
  h_nfreed = 0;
  for (int i = 0; i < op->nin; i++) {
    int dup = 0;
    for (int j = 0; j < h_nfreed; j++)
      dup |= h_freed[j] == op->in[i].mem;
    if (!dup && op->in[i].mem) {
      VKB->free(d, op->in[i].mem);
      h_freed[h_nfreed++] = op->in[i].mem;
    }
  }
  for (int i = 0; i < op->nin; i++)
    op->in[i].mem = NULL;
  return r;
}

/* Max |got - want| / (max |want| + tiny) over all elements. */
static inline double h_relerr(const struct htensor *got, const double complex *want,
                              int64_t n) {
  double maxw = 1e-30, maxd = 0;
  if (got->n != n)
    return INFINITY;
  for (int64_t i = 0; i < n; i++) {
    double w = cabs(want[i]), e = cabs(got->v[i] - want[i]);
    if (w > maxw)
      maxw = w;
    if (!(e <= maxd))
      maxd = e;
  }
  return maxd / maxw;
}

static inline double h_tol(dspk_dtype dt) {
  return (dt == DSPK_F64 || dt == DSPK_C128) ? 1e-12 : 2e-5;
}

#endif
