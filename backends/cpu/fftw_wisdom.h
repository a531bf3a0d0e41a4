/*
 * FFTW wisdom kept in the persistent cache as named blobs, so that plans
 * made once with FFTW_MEASURE are re-made from wisdom in about a
 * millisecond after a restart.  One blob per precision, named
 * "fftw-wisdom/<f64|f32>/<fftw version>/<cpu model>": wisdom is valid only
 * for the FFTW build and the CPU that measured it, so either change is a
 * different name, never a stale hit.
 *
 * Threads.  FFTW's planner and its wisdom functions are not thread-safe:
 * the caller holds the lock it uses around planning (the cpu backend's
 * dspk__cpu_fftw_lock) across every call here.
 */
#ifndef DSPK_BACKENDS_CPU_FFTW_WISDOM_H
#define DSPK_BACKENDS_CPU_FFTW_WISDOM_H

#include <stddef.h>

#include "cache/cache.h"

/* Writes the blob name for one precision (dbl: 1 for double, 0 for float)
 * into buf ("" fits nothing: returns DSPK_ERANGE when len is too small).
 * The CPU model is read from /proc/cpuinfo once per process. */
int dspk__fftw_wisdom_name(int dbl, char *buf, size_t len);

/* Imports the stored wisdom of both precisions into FFTW.  Returns how
 * many precisions were imported (0..2), or a negative dspk_errno.  A
 * stored blob that FFTW rejects is skipped (not counted) and replaced by
 * the next save.  NULL cache: 0. */
int dspk__fftw_wisdom_load(struct dspk__cache *c);

/* Exports FFTW's current wisdom of both precisions and stores each one that
 * differs from what this process last loaded or stored.  Call it after
 * planning with FFTW_MEASURE.  Returns how many blobs were written (0..2)
 * or a negative dspk_errno.  NULL cache: 0. */
int dspk__fftw_wisdom_save(struct dspk__cache *c);

/* A plan of precision dbl served from a memo: a use of that precision's
 * stored wisdom, once this process has loaded or stored it
 * (dspk__cache_blob_used; batched, no write per use). */
void dspk__fftw_wisdom_used(struct dspk__cache *c, int dbl);

#endif /* DSPK_BACKENDS_CPU_FFTW_WISDOM_H */
