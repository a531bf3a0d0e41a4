/*
 * A narrow wrapper around VkFFT (vk_vkfft.c), so that only one file sees
 * its large header.  A plan is one VkFFT application: batch transforms of
 * length n along contiguous rows, complex in place on `buf` (c2c), or real
 * `inbuf` rows of n to complex rows of n/2+1 in `buf` (r2c).  Offsets and
 * buffers are given at each launch; sizes are fixed per plan.
 */
#ifndef DSPK_BACKENDS_VULKAN_VK_VKFFT_H
#define DSPK_BACKENDS_VULKAN_VK_VKFFT_H

#include <stddef.h>
#include <stdint.h>

struct dspk__vkfft;

struct dspk__vkfft_desc {
  uint64_t n, batch;
  int dbl, r2c;
  VkBuffer buf, inbuf;      /* buffers the plan is made with */
  uint64_t bufsize, insize; /* their sizes in bytes */
};

/* Makes a plan.  bin (from an earlier save, may be NULL) skips VkFFT's
 * shader compilation; when bin is NULL and save is not, *save gets the
 * compiled binaries (malloc'd) for the cache.  Returns 0, DSPK_ENOMEM, or
 * -1000 - VkFFTResult. */
int dspk__vkfft_create(struct dspk__dev *d, VkFence *fence,
                       const struct dspk__vkfft_desc *desc, const void *bin,
                       size_t binlen, struct dspk__vkfft **out, void **save,
                       size_t *savelen);
/* Records the transform into cb.  Returns 0 or -1000 - VkFFTResult. */
int dspk__vkfft_append(struct dspk__vkfft *f, VkCommandBuffer cb, int inverse,
                       VkBuffer buf, uint64_t off, VkBuffer inbuf, uint64_t inoff);
/* VkFFT's version number (e.g. 10226), part of the cache key. */
int dspk__vkfft_version(void);
/* Frees the plan (the device must be done with it).  Accepts NULL. */
void dspk__vkfft_destroy(struct dspk__vkfft *f);

#endif
