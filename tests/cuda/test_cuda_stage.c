/*
 * CI test of the CUDA backend's pinned staging ring (backends/cuda/cuda.c)
 * without a GPU: the driver table is filled with fakes whose stream really
 * is asynchronous.  Copies and event records queue up and run only when
 * something waits (cuEventSynchronize, cuStreamSynchronize), reading their
 * source at that moment, as a DMA engine would; a copy from or to memory
 * the fake did not pin runs at once (the driver's pageable path).  So a
 * ring that refilled a chunk before the copy that reads it had run would
 * send the wrong bytes, and the checks against a plain host model of the
 * device memory would fail.  Cases: random writes and reads of odd sizes
 * and offsets through rings of 2 and 3 small chunks (the source buffer is
 * scribbled over as soon as each write returns); reads that queue behind
 * earlier writes; a failing host allocation (the ring stays off, copies go
 * the pageable way); a failing event record (the stream is drained, the
 * ring stays usable); a failing record and drain (the ring is retired,
 * later copies go the pageable way, close frees it once the stream is
 * idle); the daemon's page-locked result blocks (host_alloc: one DMA per
 * read, reuse, the bound on what is kept, trim).  Fixed seeds; no GPU, no
 * driver library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/cuda/cuda_internal.h"
#include "tests/cuda/fake_events.h"

/* ---- the fake driver ------------------------------------------------------ */

enum { OP_COPY, OP_RECORD };
struct fop {
  int kind;
  void *dst;
  const void *src;
  size_t n;
};
#define QMAX 65536
static struct fop queue[QMAX];
static uint64_t queued, executed; /* sequence numbers */
static struct { void *p; size_t n; } pinned[8];
static int npinned;
static int fail_hostalloc, fail_record, fail_sync; /* one-shot faults */
static uint64_t syncs;

static void run_until(uint64_t seq) {
  while (executed < seq) {
    struct fop *o = &queue[executed % QMAX];
    if (o->kind == OP_COPY)
      memcpy(o->dst, o->src, o->n);
    executed++;
  }
}

static void enqueue(int kind, void *dst, const void *src, size_t n) {
  assert_true(queued - executed < QMAX);
  queue[queued % QMAX] = (struct fop){kind, dst, src, n};
  queued++;
}

static int is_pinned(const void *p, size_t n) {
  for (int i = 0; i < npinned; i++)
    if ((const char *)p >= (char *)pinned[i].p &&
        (const char *)p + n <= (char *)pinned[i].p + pinned[i].n)
      return 1;
  return 0;
}

static CUresult f_hostalloc(void **pp, size_t n, unsigned flags) {
  (void)flags;
  if (fail_hostalloc) {
    fail_hostalloc = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  assert_true(npinned < 8);
  *pp = malloc(n);
  pinned[npinned].p = *pp;
  pinned[npinned++].n = n;
  return CUDA_SUCCESS;
}

static CUresult f_freehost(void *p) {
  for (int i = 0; i < npinned; i++)
    if (pinned[i].p == p) {
      /* Nothing may still read or fill it. */
      for (uint64_t s = executed; s < queued; s++) {
        const struct fop *o = &queue[s % QMAX];
        assert_false(o->kind == OP_COPY && (o->src == p || is_pinned(o->src, 1) ||
                                            is_pinned(o->dst, 1)));
      }
      pinned[i] = pinned[--npinned];
      free(p);
      return CUDA_SUCCESS;
    }
  fail_msg("cuMemFreeHost of memory not from cuMemHostAlloc");
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult f_evrecord(CUevent ev, CUstream s) {
  (void)s;
  if (fail_record) {
    fail_record = 0;
    return CUDA_ERROR_INVALID_VALUE;
  }
  enqueue(OP_RECORD, NULL, NULL, 0);
  ((struct fev *)ev)->target = queued;
  return CUDA_SUCCESS;
}
static CUresult f_evquery(CUevent ev) {
  return executed >= ((struct fev *)ev)->target ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult f_evsync(CUevent ev) {
  run_until(((struct fev *)ev)->target);
  return CUDA_SUCCESS;
}
static CUresult f_streamsync(CUstream s) {
  (void)s;
  if (fail_sync) {
    fail_sync = 0;
    return CUDA_ERROR_INVALID_VALUE;
  }
  syncs++;
  run_until(queued);
  return CUDA_SUCCESS;
}
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  (void)s;
  if (!is_pinned(src, n)) { /* pageable: staged by the driver at once */
    run_until(queued);
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
  }
  enqueue(OP_COPY, (void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
static CUresult f_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  if (!is_pinned(dst, n)) {
    run_until(queued);
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
  }
  enqueue(OP_COPY, dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

static struct dspk__dev *dev;

static int setup(void **state) {
  (void)state;
  dev = fake_dev(f_evrecord, f_evquery, f_evsync, f_streamsync);
  dspk__cu.cuMemHostAlloc = f_hostalloc;
  dspk__cu.cuMemFreeHost = f_freehost;
  dspk__cu.cuMemcpyHtoDAsync = f_htod;
  dspk__cu.cuMemcpyDtoHAsync = f_dtoh;
  queued = executed = 0;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  /* What close() does with the ring. */
  assert_int_equal(dspk__cuda_stage_config(dev, 0, 0), 0);
  assert_int_equal(npinned, 0);
  assert_int_equal(nevents, 0);
  free(dev);
  dev = NULL;
  return 0;
}

/* ---- the model -------------------------------------------------------------- */

enum { DEVSZ = 200000 };
static unsigned char devmem[DEVSZ], model[DEVSZ];
static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Random writes and reads against the model; sizes from 1 byte to several
 * times the ring. */
static void random_traffic(int rounds, size_t ring_bytes) {
  unsigned char *src = malloc(DEVSZ), *dst = malloc(DEVSZ + 1);
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)devmem;
  for (int r = 0; r < rounds; r++) {
    size_t max = (next() % 4 == 0) ? DEVSZ : 3 * ring_bytes;
    size_t n = 1 + (size_t)(next() % (max < DEVSZ ? max : DEVSZ));
    size_t off = (size_t)(next() % (DEVSZ - n + 1));
    if (next() % 3) {
      for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)next();
      assert_int_equal(dspk__cuda_stage_write(dev, base + off, src, n), 0);
      memcpy(model + off, src, n);
      memset(src, 0xee, n); /* the caller may reuse src at once */
    } else {
      memset(dst, 0x11, n + 1);
      assert_int_equal(dspk__cuda_stage_read(dev, dst + 1, base + off, n), 0);
      if (memcmp(dst + 1, model + off, n) != 0)
        fail_msg("round %d: read of %zu bytes at %zu differs from what was written", r, n,
                 off);
      /* A read also orders after everything before it. */
      assert_int_equal(executed, queued);
    }
  }
  assert_int_equal(dspk__cuda_stage_read(dev, dst, base, DEVSZ), 0);
  assert_memory_equal(dst, model, DEVSZ);
  free(src);
  free(dst);
}

static void reset_memory(void) {
  for (size_t i = 0; i < DEVSZ; i++)
    devmem[i] = model[i] = (unsigned char)(i * 7);
}

static void test_rings(void **state) {
  static const struct { int n; size_t chunk; } rings[] = {{2, 4096}, {3, 8192}, {16, 4096}};
  (void)state;
  for (size_t k = 0; k < sizeof(rings) / sizeof(rings[0]); k++) {
    uint64_t waits0;
    reset_memory();
    assert_int_equal(dspk__cuda_stage_config(dev, rings[k].n, rings[k].chunk), 0);
    assert_non_null(dev->stage.host);
    assert_int_equal(nevents, rings[k].n);
    waits0 = dev->stage.waits;
    random_traffic(400, (size_t)rings[k].n * rings[k].chunk);
    /* Writes of more than the ring had to wait for chunks in flight. */
    assert_true(dev->stage.waits > waits0);
    printf("ring %d x %zu: %llu h2d, %llu d2h chunks, %llu waits\n", rings[k].n,
           rings[k].chunk, (unsigned long long)dev->stage.chunks_h2d,
           (unsigned long long)dev->stage.chunks_d2h, (unsigned long long)dev->stage.waits);
  }
}

/* Writes return with their copies still queued; a ring of two chunks is
 * reused many times before anything runs, and the data must still land. */
static void test_writes_stay_queued(void **state) {
  unsigned char buf[10000];
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)devmem;
  (void)state;
  reset_memory();
  assert_int_equal(dspk__cuda_stage_config(dev, 2, 4096), 0);
  for (int w = 0; w < 20; w++) {
    memset(buf, w + 1, sizeof(buf));
    assert_int_equal(dspk__cuda_stage_write(dev, base + (size_t)w * 10000, buf, sizeof(buf)),
                     0);
    memset(model + (size_t)w * 10000, w + 1, sizeof(buf));
  }
  /* The last chunks are still in flight: nothing waited for them. */
  assert_true(executed < queued);
  assert_int_equal(dspk__cuda_stage_read(dev, buf, base + 123, 5000), 0);
  assert_memory_equal(buf, model + 123, 5000);
  assert_memory_equal(devmem, model, DEVSZ);
}

static void test_faults(void **state) {
  unsigned char buf[20000];
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)devmem;
  (void)state;
  reset_memory();
  /* No pinned memory: an error, the ring off, copies still right. */
  fail_hostalloc = 1;
  assert_int_equal(dspk__cuda_stage_config(dev, 4, 4096), DSPK_ENOMEM);
  assert_null(dev->stage.host);
  assert_int_equal(nevents, 0);
  random_traffic(50, 16384);

  /* A failing record: the write fails, the stream was drained, the ring
   * goes on. */
  assert_int_equal(dspk__cuda_stage_config(dev, 2, 4096), 0);
  memset(buf, 0x5a, sizeof(buf));
  fail_record = 1;
  assert_true(dspk__cuda_stage_write(dev, base, buf, sizeof(buf)) < 0);
  assert_int_equal(executed, queued);
  assert_int_equal(dev->stage.broken, 0);
  assert_int_equal(dspk__cuda_stage_write(dev, base, buf, sizeof(buf)), 0);
  memset(model, 0x5a, sizeof(buf));
  random_traffic(100, 8192);

  /* A failing record and a failing drain: the ring is retired (a copy
   * from it may still be pending), later copies go the pageable way, and
   * it is freed only once the stream is idle (f_freehost checks). */
  fail_record = 1;
  fail_sync = 1;
  assert_true(dspk__cuda_stage_write(dev, base + 100, buf, sizeof(buf)) < 0);
  assert_int_equal(dev->stage.broken, 1);
  memset(model + 100, 0x5a, sizeof(buf));
  random_traffic(100, 8192);
}

/* Shared-memory buffers: a client mapping registered with cuMemHostRegister
 * is copied with one DMA from and to its own pages (no ring chunk), and
 * unregistering drains the stream first (a queued copy may still read it). */
static int nregistered, unregistered_pending;
static CUresult f_register(void *p, size_t n, unsigned flags) {
  (void)flags;
  assert_true(npinned < 8);
  pinned[npinned].p = p;
  pinned[npinned++].n = n;
  nregistered++;
  return CUDA_SUCCESS;
}
static CUresult f_unregister(void *p) {
  for (int i = 0; i < npinned; i++)
    if (pinned[i].p == p) {
      unregistered_pending += (int)(queued - executed);
      pinned[i] = pinned[--npinned];
      nregistered--;
      return CUDA_SUCCESS;
    }
  fail_msg("cuMemHostUnregister of memory not registered");
  return CUDA_ERROR_INVALID_VALUE;
}

static void test_host_register(void **state) {
  enum { N = 3 * 4096 + 100 };
  unsigned char *h = malloc(N), *back = malloc(N);
  (void)state;
  dspk__cu.cuMemHostRegister = f_register;
  dspk__cu.cuMemHostUnregister = f_unregister;
  assert_int_equal(dspk__cuda_stage_config(dev, 2, 4096), 0);
  for (int i = 0; i < N; i++)
    h[i] = (unsigned char)(i * 7 + 1);
  assert_int_equal(dspk__cuda_host_register(dev, h, N), 0);
  assert_int_equal(nregistered, 1);
  uint64_t before = dev->stage.chunks_h2d, q0 = queued;
  memset(devmem, 0, N);
  assert_int_equal(dspk__cuda_stage_write(dev, (CUdeviceptr)(uintptr_t)devmem, h + 50,
                                          N - 50), 0);
  assert_int_equal(dev->stage.chunks_h2d, before); /* no ring chunk */
  assert_int_equal(queued - q0, 1);                /* one DMA, queued */
  assert_true(queue[q0 % QMAX].src == h + 50);     /* from the client's pages */
  /* read back into another part of the registered mapping: one DMA too */
  memset(h, 0, 50);
  assert_int_equal(dspk__cuda_stage_read(dev, h, (CUdeviceptr)(uintptr_t)devmem, 40), 0);
  for (int i = 0; i < 40; i++)
    assert_int_equal(h[i], (unsigned char)((i + 50) * 7 + 1));
  /* a queued write from the mapping, then unregister: drained first */
  assert_int_equal(dspk__cuda_stage_write(dev, (CUdeviceptr)(uintptr_t)devmem, h, 64), 0);
  assert_true(queued > executed);
  dspk__cuda_host_unregister(dev, h);
  assert_int_equal(unregistered_pending, 0);
  assert_int_equal(nregistered, 0);
  assert_int_equal(dev->nhostreg, 0);
  /* not registered any more: the ring again */
  before = dev->stage.chunks_h2d;
  assert_int_equal(dspk__cuda_stage_write(dev, (CUdeviceptr)(uintptr_t)devmem, h, 5000), 0);
  assert_true(dev->stage.chunks_h2d > before);
  assert_int_equal(dspk__cuda_stage_read(dev, back, (CUdeviceptr)(uintptr_t)devmem, 5000), 0);
  assert_memory_equal(back, h, 5000);
  free(h);
  free(back);
}

/* host_alloc (the daemon's results): page-locked blocks in size classes;
 * a read into one is a single DMA (no ring chunk); a block given back is
 * reused for the next result of its class; blocks given back are kept up
 * to DSPK__GPURT_HOSTMEM_KEEP and freed beyond it; trim frees every block
 * not in use; none above DSPK__GPURT_HOSTMEM_MAX. */
static void test_host_alloc(void **state) {
  enum { N = 70000 };
  const size_t big = (size_t)24 << 20; /* class 32 MiB */
  (void)state;
  assert_int_equal(dspk__cuda_stage_config(dev, 2, 4096), 0);
  assert_int_equal(npinned, 1); /* the ring */
  for (int i = 0; i < N; i++)
    devmem[i] = (unsigned char)(i * 13 + 5);
  unsigned char *a = dspk__gpurt_host_alloc(dev, N);
  assert_non_null(a);
  assert_int_equal(npinned, 2);
  uint64_t before = dev->stage.chunks_d2h, q0 = queued;
  assert_int_equal(dspk__cuda_stage_read(dev, a, (CUdeviceptr)(uintptr_t)devmem, N), 0);
  assert_int_equal(dev->stage.chunks_d2h, before); /* no ring chunk */
  assert_int_equal(queued - q0, 1);                /* one DMA, into the block */
  assert_true(queue[q0 % QMAX].dst == a);
  assert_memory_equal(a, devmem, N);
  dspk__gpurt_host_free(dev, a);
  assert_int_equal(npinned, 2); /* kept */
  unsigned char *b = dspk__gpurt_host_alloc(dev, 100000); /* the same class */
  assert_ptr_equal(b, a);
  unsigned char *c = dspk__gpurt_host_alloc(dev, 100000); /* b is in use */
  assert_non_null(c);
  assert_ptr_not_equal(c, b);
  assert_int_equal(npinned, 3);
  unsigned char *d = dspk__gpurt_host_alloc(dev, 1);
  assert_non_null(d);
  assert_int_equal(npinned, 4);
  dspk__gpurt_host_free(dev, b);
  dspk__gpurt_host_free(dev, c);
  dspk__gpurt_trim(dev); /* b and c go, d is in use */
  assert_int_equal(npinned, 2);
  dspk__gpurt_host_free(dev, d);
  /* Given back beyond the bound: freed at once. */
  unsigned char *x = dspk__gpurt_host_alloc(dev, big), *y = dspk__gpurt_host_alloc(dev, big),
                *z = dspk__gpurt_host_alloc(dev, big);
  assert_true(x && y && z);
  assert_int_equal(npinned, 5);
  dspk__gpurt_host_free(dev, x);
  dspk__gpurt_host_free(dev, y); /* 64 KiB + 2 x 32 MiB kept: over the bound */
  assert_int_equal(npinned, 4);
  dspk__gpurt_host_free(dev, z);
  assert_int_equal(npinned, 3);
  dspk__gpurt_host_free(dev, (void *)devmem); /* not a block: ignored */
  assert_null(dspk__gpurt_host_alloc(dev, DSPK__GPURT_HOSTMEM_MAX + 1)); /* malloc's */
  dspk__gpurt_trim(dev);
  assert_int_equal(npinned, 1);
  assert_int_equal(dev->nhostmem, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_rings, setup, teardown),
      cmocka_unit_test_setup_teardown(test_writes_stay_queued, setup, teardown),
      cmocka_unit_test_setup_teardown(test_faults, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_register, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_alloc, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
