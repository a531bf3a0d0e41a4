/*
 * What the CI tests of the CUDA backend against a fake driver
 * (test_cuda_stage.c, test_cuda_fence.c) share: events on the host heap,
 * counted, and a device of the shared GPU runtime over the CUDA table with
 * the test's fakes of the stream.  No GPU, no driver library.
 */
#ifndef DSPK_TESTS_CUDA_FAKE_EVENTS_H
#define DSPK_TESTS_CUDA_FAKE_EVENTS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"

struct fev {
  uint64_t target; /* sequence number of its last record; 0: never */
  CUresult err;    /* what the device reports at this point (test_cuda_fence) */
};
static int nevents; /* live events: none may be left at the end */

static CUresult f_evcreate(CUevent *ev, unsigned flags) {
  (void)flags;
  *ev = (CUevent)calloc(1, sizeof(struct fev));
  nevents++;
  return CUDA_SUCCESS;
}
static CUresult f_evdestroy(CUevent ev) {
  free(ev);
  nevents--;
  return CUDA_SUCCESS;
}

/* Empties the driver table, puts in the fake events with the test's
 * record, query and synchronisations, and returns a device of the shared
 * runtime over the table (freed with free()). */
static struct dspk__dev *fake_dev(CUresult (*record)(CUevent, CUstream),
                                  CUresult (*query)(CUevent), CUresult (*evsync)(CUevent),
                                  CUresult (*streamsync)(CUstream)) {
  struct dspk__dev *d;
  memset(&dspk__cu, 0, sizeof(dspk__cu));
  dspk__cu.cuEventCreate = f_evcreate;
  dspk__cu.cuEventDestroy = f_evdestroy;
  dspk__cu.cuEventRecord = record;
  dspk__cu.cuEventQuery = query;
  dspk__cu.cuEventSynchronize = evsync;
  dspk__cu.cuStreamSynchronize = streamsync;
  d = calloc(1, sizeof(*d));
  d->drv = &dspk__gpurt_cuda; /* the shared runtime over the CUDA table */
  d->stream = (CUstream)(uintptr_t)0x5150;
  return d;
}

#endif /* DSPK_TESTS_CUDA_FAKE_EVENTS_H */
