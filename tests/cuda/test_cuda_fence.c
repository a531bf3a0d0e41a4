/*
 * CI test of the CUDA backend's fences as the daemon uses them (the backend
 * table's fence_record, fence_query, fence_wait, fence_destroy) without a
 * GPU: the driver table is filled with fakes, as in test_cuda_stage.c.  An
 * event completes only when the test lets the fake stream run up to it, and
 * the test can make the device report an error at one event, as a kernel
 * that faulted reports it through the next event behind it.  The daemon
 * answers each task from its own fence (daemon/device.c), so:
 *   - a fence not yet reached is 0 (query), and reached ones are 1;
 *   - a non-sticky error reported at one event fails that fence only: the
 *     fences before and after it still complete;
 *   - a sticky error (the context is dead) fails that fence and every later
 *     one, the fences that completed before it stay complete, and recording
 *     a new fence fails (EDEVICE);
 *   - a fence of an older context generation (the context was rebuilt after
 *     a fault) reports EDEVICE, never "reached": its work was lost.
 * No GPU, no driver library.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/cuda/cuda_internal.h"
#include "tests/cuda/fake_events.h"
#include "proto/schema.h"

extern const struct dspk__backend dspk__backend_cuda;
#define BE dspk__backend_cuda

/* ---- the fake driver ------------------------------------------------------ */

static uint64_t recorded, executed;
static CUresult sticky_err; /* once set, every query and sync reports it */
static CUresult next_err;   /* the next recorded event reports this */

static CUresult f_evrecord(CUevent ev, CUstream s) {
  struct fev *e = (struct fev *)ev;
  (void)s;
  if (sticky_err)
    return sticky_err;
  e->target = ++recorded;
  e->err = next_err;
  next_err = CUDA_SUCCESS;
  return CUDA_SUCCESS;
}
static CUresult reached(struct fev *e) {
  if (executed < e->target)
    return CUDA_ERROR_NOT_READY;
  if (e->err == CUDA_ERROR_ILLEGAL_ADDRESS || e->err == CUDA_ERROR_LAUNCH_FAILED)
    sticky_err = e->err;
  if (sticky_err)
    return sticky_err;
  return e->err;
}
static CUresult f_evquery(CUevent ev) {
  if (sticky_err)
    return sticky_err;
  return reached((struct fev *)ev);
}
static CUresult f_evsync(CUevent ev) {
  struct fev *e = (struct fev *)ev;
  if (sticky_err)
    return sticky_err;
  if (executed < e->target)
    executed = e->target;
  return reached(e);
}
static CUresult f_streamsync(CUstream s) {
  (void)s;
  executed = recorded;
  return sticky_err;
}

static struct dspk__dev *dev;

static int setup(void **state) {
  (void)state;
  dev = fake_dev(f_evrecord, f_evquery, f_evsync, f_streamsync);
  dev->gen = 1;
  recorded = executed = 0;
  sticky_err = next_err = CUDA_SUCCESS;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  /* What close() does with the spare events. */
  while (dev->nspare > 0)
    f_evdestroy(dev->spare[--dev->nspare]);
  free(dev);
  dev = NULL;
  return 0;
}

/* Records n fences; the k-th (from 0) reports err when reached. */
static void record(struct dspk__fence **f, int n, int k, CUresult err) {
  for (int i = 0; i < n; i++) {
    if (i == k)
      next_err = err;
    assert_int_equal(BE.fence_record(dev, &f[i]), 0);
    assert_non_null(f[i]);
  }
}

static void destroy(struct dspk__fence **f, int n) {
  for (int i = 0; i < n; i++)
    BE.fence_destroy(dev, f[i]);
}

/* Fences complete in order, one by one as the stream runs. */
static void test_order(void **state) {
  struct dspk__fence *f[3];
  (void)state;
  record(f, 3, -1, CUDA_SUCCESS);
  for (int i = 0; i < 3; i++)
    assert_int_equal(BE.fence_query(dev, f[i]), 0);
  executed = 1;
  assert_int_equal(BE.fence_query(dev, f[0]), 1);
  assert_int_equal(BE.fence_query(dev, f[1]), 0);
  assert_int_equal(BE.fence_wait(dev, f[1]), 0);
  assert_int_equal(BE.fence_query(dev, f[1]), 1);
  assert_int_equal(BE.fence_query(dev, f[2]), 0);
  assert_int_equal(BE.fence_wait(dev, f[2]), 0);
  destroy(f, 3);
}

/* A non-sticky error at one point fails that fence alone. */
static void test_error_one(void **state) {
  struct dspk__fence *f[3];
  (void)state;
  record(f, 3, 1, CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(BE.fence_wait(dev, f[0]), 0);
  assert_int_equal(BE.fence_query(dev, f[1]), 0);
  assert_int_equal(BE.fence_wait(dev, f[1]), DSPK_EDEVICE);
  assert_int_equal(BE.fence_query(dev, f[1]), DSPK_EDEVICE);
  assert_int_equal(BE.fence_query(dev, f[2]), 0);
  assert_int_equal(BE.fence_wait(dev, f[2]), 0);
  assert_int_equal(BE.fence_query(dev, f[0]), 1);
  assert_int_equal(dev->ctx_dead, 0);
  destroy(f, 3);
  /* The device goes on. */
  record(f, 1, -1, CUDA_SUCCESS);
  assert_int_equal(BE.fence_wait(dev, f[0]), 0);
  destroy(f, 1);
}

/* A sticky error: that fence and every later one fail, nothing new can be
 * recorded; the fence answered before stays answered (the daemon never asks
 * again), and the device is dead. */
static void test_error_sticky(void **state) {
  struct dspk__fence *f[3], *g = NULL;
  (void)state;
  record(f, 3, 1, CUDA_ERROR_ILLEGAL_ADDRESS);
  assert_int_equal(BE.fence_wait(dev, f[0]), 0);
  assert_int_equal(BE.fence_query(dev, f[1]), 0);
  executed = 2;
  assert_int_equal(BE.fence_query(dev, f[1]), DSPK_EDEVICE);
  assert_int_equal(dev->ctx_dead, 1);
  assert_int_equal(BE.fence_query(dev, f[2]), DSPK_EDEVICE);
  assert_int_equal(BE.fence_wait(dev, f[2]), DSPK_EDEVICE);
  assert_int_equal(BE.fence_record(dev, &g), DSPK_EDEVICE);
  {
    /* A dead context's events go with it: destroy neither keeps nor
     * destroys them (the fake frees them here). */
    CUevent ev[3] = {f[0]->ev, f[1]->ev, f[2]->ev};
    destroy(f, 3);
    assert_int_equal(dev->nspare, 0);
    for (int i = 0; i < 3; i++)
      f_evdestroy(ev[i]);
  }
}

/* A fence from before the context was rebuilt: its work is gone. */
static void test_stale_generation(void **state) {
  struct dspk__fence *f[1];
  (void)state;
  record(f, 1, -1, CUDA_SUCCESS);
  dev->gen++;
  assert_int_equal(BE.fence_query(dev, f[0]), DSPK_EDEVICE);
  assert_int_equal(BE.fence_wait(dev, f[0]), DSPK_EDEVICE);
  {
    /* Its event belonged to the old context: not reused, not destroyed. */
    CUevent ev = f[0]->ev;
    destroy(f, 1);
    assert_int_equal(dev->nspare, 0);
    f_evdestroy(ev);
  }
}

/* The capability query of the table (dspk__gpurt_caps, no driver call):
 * every op; f16/bf16 gemm only through cuBLAS (not without it, nor with
 * the own-kernels switch); raw kernels in "cuda" only. */
static void test_caps(void **state) {
  struct dspk__devcaps caps;
  struct dspk__op o;
  char msg[256];
  const uint32_t f = (1u << DSPK_F32) | (1u << DSPK_F64);
  const uint32_t half = (1u << DSPK_F16) | (1u << DSPK_BF16);
  (void)state;
  for (int k = 0; k < 3; k++) {
    dev->blas = k ? (void *)(uintptr_t)0xb1a5 : NULL;
    dev->own_kernels = k == 2;
    memset(&caps, 0, sizeof caps);
    BE.caps(dev, &caps);
    assert_int_equal(caps.dtypes[DSPK_OP_GEMM], k == 1 ? f | half : f);
    for (int op = DSPK_OP_FFT; op < DSPK_OP_KERNEL; op++)
      assert_int_equal(caps.dtypes[op], dspk__op_dtypes[op]);
    assert_int_equal(caps.langs, 1u << dspk__choice_find(dspk__kernel_langs, "cuda", 4));
  }
  dev->blas = NULL;
  dev->own_kernels = 0;
  memset(&o, 0, sizeof o);
  o.kind = DSPK_OP_GEMM;
  o.nin = 2;
  o.in[0].dtype = o.in[1].dtype = DSPK_BF16;
  assert_int_equal(dspk__caps_check(&caps, &o, "cuda:0", msg, sizeof msg), DSPK_ENOTSUP);
  assert_string_equal(msg, "gemm: cuda:0 does not run gemm on bf16 (it takes f32, f64)");
  memset(&o, 0, sizeof o);
  o.kind = DSPK_OP_KERNEL;
  o.u.kernel.lang = "glsl";
  assert_int_equal(dspk__caps_check(&caps, &o, "cuda:0", msg, sizeof msg), DSPK_ENOTSUP);
  assert_string_equal(msg, "kernel: cuda:0 takes lang cuda, not \"glsl\"");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_caps, setup, teardown),
      cmocka_unit_test_setup_teardown(test_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_error_one, setup, teardown),
      cmocka_unit_test_setup_teardown(test_error_sticky, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stale_generation, setup, teardown),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (rc == 0 && nevents != 0) {
    fprintf(stderr, "%d fake events left\n", nevents);
    return 1;
  }
  return rc;
}
