/*
 * Our own FFT kernels for the Vulkan backend (vk_sfft.c): complex float
 * (c64) transforms of power-of-two lengths, batched along contiguous rows,
 * out of place.  A length of at most DSPK__SK_MAXL is one pass (each
 * workgroup transforms whole rows in shared memory); a longer one, up to
 * DSPK__SK_MAXL^2, is two passes through a temporary buffer (the four-step
 * decomposition n = n1 x n2: n2 column transforms of n1, each output
 * multiplied by its twiddle, then n1 row transforms of n2 written to their
 * places in the result).  Inside a workgroup a transform is Stockham
 * radix-R stages, R values held in registers by each thread.
 *
 * They are offered to the fft tuner (vk_fft.c) beside VkFFT's
 * configurations: the fastest correct one is used.
 */
#ifndef DSPK_BACKENDS_VULKAN_VK_SFFT_H
#define DSPK_BACKENDS_VULKAN_VK_SFFT_H

#include <stddef.h>
#include <stdint.h>

#define DSPK__SK_MAXL 4096u /* the longest transform of one pass */

struct dspk__dev;
struct dspk__opctx;
struct dspk__vk_bind;

/* One configuration: l1 the first pass's length (1: a single pass), and
 * per pass c transforms per workgroup, e values per thread and h groups
 * (0 or 1: one) of c/h transforms that take turns in shared memory, so
 * that more transforms per workgroup fit in it. */
struct dspk__vk_sfft_cfg {
  uint32_t l1;
  uint32_t c[2], e[2], h[2];
};

/* Whether cfg can run n x batch on d (lengths, shared memory, workgroup
 * size, 32-bit indexing and buffer range). */
int dspk__vk_sfft_valid(const struct dspk__dev *d, uint64_t n, uint64_t batch,
                        const struct dspk__vk_sfft_cfg *cfg);
/* Fills out[0..max) with the configurations the tuner tries for n x
 * batch on d and returns how many (0 when n is not a power of two in
 * range). */
int dspk__vk_sfft_cands(const struct dspk__dev *d, uint64_t n, uint64_t batch,
                        struct dspk__vk_sfft_cfg *out, int max);
/* The configuration's name ("sk:1024:8/16/2:4/16", "sk:1:4/16": first
 * pass length, then c/e[/h] per pass), 
 * and back (returns 0, or -1 for a string that is not one). */
void dspk__vk_sfft_name(const struct dspk__vk_sfft_cfg *cfg, char *buf, size_t len);
int dspk__vk_sfft_parse(const char *s, struct dspk__vk_sfft_cfg *cfg);
/* Records O = fft(X) (ifft scaled by 1/n when inverse) of batch rows of n:
 * X's first element is xelem of binding x, O's oelem of o; they must not
 * overlap.  The plan (twiddles, temporary buffer) is kept in d's plan
 * cache, or, when own is not NULL, in *own (made there when NULL; the
 * caller then frees it with dspk__vk_sfft_plan_free or hands it to the
 * plan cache with dspk__vk_sfft_keep: the tuner keeps only the winner's).
 * Returns 0 or an error (message in ctx). */
int dspk__vk_sfft(struct dspk__dev *d, const struct dspk__vk_sfft_cfg *cfg, uint64_t n,
                  uint64_t batch, int inverse, const struct dspk__vk_bind *x, uint32_t xelem,
                  const struct dspk__vk_bind *o, uint32_t oelem, void **own,
                  struct dspk__opctx *ctx);
/* The overlap-save fir's hooks into a transform (vk_fir.c) of real f32
 * signals: rows of L complex values, each holding one block of L samples
 * in its real parts (block b of signal row r in row r*nb + b, imaginary
 * parts 0, as dspk__fir_geo says; nblk blocks in all, nb per signal row of
 * n samples, block b of a row starting at sample b*S - km1), then one row
 * more, the filter's.

 * Forward: the first pass reads the blocks straight from the signal (sig
 * from element sigoff; x is not read) and the filter's km1+1 taps (hs,
 * float, from element hoff) into the last row.  Inverse (scaled by 1/L):
 * the first pass multiplies each value it reads by the filter's spectrum
 * (hs, complex, L values from element hoff: the forward's last row) and
 * the last pass writes the last S samples of each block straight into y
 * (sig from element sigoff; o is not written).  So the gather, the
 * filter's own transform, the multiplication and the scatter cost no
 * passes over memory of their own. */
struct dspk__vk_sfft_fir {
  /* fl: the list of segments with a non-finite output (vk_fir.c,
   * DSPK__VK_FL_HEAD), which the forward transform's first pass clears and
   * the inverse's last pass appends to; cap: its push constant */
  const struct dspk__vk_bind *sig, *hs, *fl;
  uint32_t sigoff, hoff, n, km1, S, nb, nblk, cap;
};
/* dspk__vk_sfft with f's hooks (the plan from d's plan cache). */
int dspk__vk_sfft_fir(struct dspk__dev *d, const struct dspk__vk_sfft_cfg *cfg, uint64_t L,
                      uint64_t batch, int inverse, const struct dspk__vk_sfft_fir *f,
                      const struct dspk__vk_bind *x, uint32_t xelem,
                      const struct dspk__vk_bind *o, uint32_t oelem, struct dspk__opctx *ctx);
/* Puts a plan made through own into d's plan cache (or frees it when the
 * cache has one for its key or cannot take it). */
void dspk__vk_sfft_keep(struct dspk__dev *d, void *plan);
/* Measures with GPU timestamps, on fresh buffers, each pass of every
 * configuration for n x batch on d (one pass varied at a time), and the
 * best of each split whole; writes the figures into buf, a line per pass
 * and split.  For the benchmark.  Returns 0 or an error. */
int dspk__vk_sfft_profile(struct dspk__dev *d, uint64_t n, uint64_t batch, char *buf,
                          size_t len);
/* Frees a plan of kind 4 (see plan_evict), once the device is done. */
void dspk__vk_sfft_plan_free(struct dspk__dev *d, void *plan);

#endif
