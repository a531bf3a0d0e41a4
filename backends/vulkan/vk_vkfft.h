/*
 * A narrow wrapper around VkFFT (vk_vkfft.c), so that only one file sees
 * its large header.  A plan is one VkFFT application: batch transforms of
 * length n along contiguous rows, complex in place on `buf` (c2c), complex
 * out of place from `inbuf` into `buf` (c2c with oop set: both directions
 * read inbuf and write buf, inbuf is never written), or real `inbuf` rows
 * of n to complex rows of n/2+1 in `buf` (r2c).  Offsets and buffers are
 * given at each launch; sizes are fixed per plan.
 *
 * VkFFT binds its buffers through descriptor sets that it updates itself
 * when a launch names other buffers than the previous one.  Updating a
 * descriptor set that pending work still uses is not allowed in Vulkan,
 * so the caller asks dspk__vkfft_bound() first and only launches on other
 * buffers once the plan's earlier work has finished (vk_fft.c keeps a few
 * instances of each plan for that reason).
 */
#ifndef DSPK_BACKENDS_VULKAN_VK_VKFFT_H
#define DSPK_BACKENDS_VULKAN_VK_VKFFT_H

#include <stddef.h>
#include <stdint.h>

struct dspk__vkfft;

/* VkFFT's tuning knobs that dspk sets (0: VkFFT's default for the
 * device's vendor, read by VkFFT from the device's limits).  Every field
 * is part of the plan key and of the binaries' cache key. */
struct dspk__vkfft_tune {
  uint32_t coalesced;   /* coalescedMemory, bytes */
  uint32_t aim_threads; /* aimThreads per workgroup */
  uint32_t reg_boost;   /* registerBoost */
  uint32_t bw_boost;    /* performBandwidthBoost */
  uint32_t lut;         /* useLUT: twiddles from a table, not sincos */
};

struct dspk__vkfft_desc {
  uint64_t n, batch;
  int dbl, r2c, oop;
  VkBuffer buf, inbuf;      /* buffers the plan is made with */
  uint64_t bufsize, insize; /* their sizes in bytes */
  /* Optional: a temporary buffer to use instead of allocating one (another
   * instance's, see dspk__vkfft_temp); VK_NULL_HANDLE: VkFFT allocates
   * one when the transform needs it. */
  VkBuffer temp;
  uint64_t tempsize;
  struct dspk__vkfft_tune tune;
};

/* Makes a plan.  bin (from an earlier save, may be NULL) skips VkFFT's
 * shader compilation; when bin is NULL and save is not, *save gets the
 * compiled binaries (malloc'd, the caller's) for the cache.  Returns 0,
 * DSPK_ENOMEM, DSPK_EINVAL (bin too short to be a VkFFT save), or
 * -1000 - VkFFTResult. */
int dspk__vkfft_create(struct dspk__dev *d, VkFence *fence,
                       const struct dspk__vkfft_desc *desc, const void *bin,
                       size_t binlen, struct dspk__vkfft **out, void **save,
                       size_t *savelen);
/* 1 when f's descriptor sets already name buf and inbuf (a launch on them
 * updates nothing), else 0. */
int dspk__vkfft_bound(const struct dspk__vkfft *f, VkBuffer buf, VkBuffer inbuf);
/* Records the transform into cb; when f is not bound to buf/inbuf, its
 * descriptor sets are updated first, so no pending work may use f then.
 * inbuf/inoff are used by r2c and out-of-place plans only.  Returns 0 or
 * -1000 - VkFFTResult. */
int dspk__vkfft_append(struct dspk__vkfft *f, VkCommandBuffer cb, int inverse,
                       VkBuffer buf, uint64_t off, VkBuffer inbuf, uint64_t inoff);
/* 1 when a launch of f splits a dispatch (more workgroups along an axis
 * than the device's maxComputeWorkGroupCount): VkFFT 1.2.26's split
 * launches write past the plan's last row (vk_fft.c, fit_rows), so such a
 * plan must not be launched.  Else 0. */
int dspk__vkfft_split(const struct dspk__vkfft *f);
/* The temporary buffer VkFFT allocated for f (multi-pass transforms):
 * returns 1 and fills *temp, *size; 0 when f has none.  f owns it. */
int dspk__vkfft_temp(const struct dspk__vkfft *f, VkBuffer *temp, uint64_t *size);
/* How many passes over memory (kernel launches) one transform makes. */
int dspk__vkfft_passes(const struct dspk__vkfft *f);
/* VkFFT's version number (e.g. 10226), part of the cache key. */
int dspk__vkfft_version(void);
/* Frees the plan (the device must be done with it).  Accepts NULL. */
void dspk__vkfft_destroy(struct dspk__vkfft *f);

/* (vk_fft.c) Describes the stored tuning decision for out-of-place c2c
 * transforms of n x batch on d: winner, passes of its plan when cached,
 * and every candidate's timings, into buf.  Returns 0 or DSPK_ENOENT (no
 * decision, or no cache).  For the benchmark and debugging. */
int dspk__vk_fft_tune_report(struct dspk__dev *d, uint64_t n, uint64_t batch, int dbl,
                             char *buf, size_t len);
/* (vk_fft.c) Measures with GPU timestamps, on fresh buffers, a copy of
 * n x batch c64 values and an out-of-place forward transform of them with
 * each tuning candidate (plans made and freed here); writes one line into
 * buf.  Returns 0, DSPK_ENOTSUP (no timestamps on this queue), or an
 * error.  For the benchmark. */
int dspk__vk_fft_profile(struct dspk__dev *d, uint64_t n, uint64_t batch, char *buf,
                         size_t len);

#endif
