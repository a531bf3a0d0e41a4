/*
 * The one translation unit that includes VkFFT (a patched copy of Debian's
 * vkFFT.h made in the build tree by vkfft-patch.sh).  VkFFT calls Vulkan
 * through its prototypes; here each name is mapped onto the backend's
 * function table (the loader is dlopen'd), and its diagnostic printf is
 * silenced (library code never prints).  This file is compiled without
 * warnings because VkFFT's header is not warning-clean; vk_fft.c holds the
 * backend's own logic.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk.h"
#include "backends/vulkan/vk_vkfft.h"

#define printf(...) 0
#define vkAllocateCommandBuffers VK(AllocateCommandBuffers)
#define vkAllocateDescriptorSets VK(AllocateDescriptorSets)
#define vkAllocateMemory VK(AllocateMemory)
#define vkBeginCommandBuffer VK(BeginCommandBuffer)
#define vkBindBufferMemory VK(BindBufferMemory)
#define vkCmdBindDescriptorSets VK(CmdBindDescriptorSets)
#define vkCmdBindPipeline VK(CmdBindPipeline)
#define vkCmdCopyBuffer VK(CmdCopyBuffer)
#define vkCmdDispatch VK(CmdDispatch)
#define vkCmdPipelineBarrier VK(CmdPipelineBarrier)
#define vkCmdPushConstants VK(CmdPushConstants)
#define vkCreateBuffer VK(CreateBuffer)
#define vkCreateComputePipelines VK(CreateComputePipelines)
#define vkCreateDescriptorPool VK(CreateDescriptorPool)
#define vkCreateDescriptorSetLayout VK(CreateDescriptorSetLayout)
#define vkCreatePipelineLayout VK(CreatePipelineLayout)
#define vkCreateShaderModule VK(CreateShaderModule)
#define vkDestroyBuffer VK(DestroyBuffer)
#define vkDestroyDescriptorPool VK(DestroyDescriptorPool)
#define vkDestroyDescriptorSetLayout VK(DestroyDescriptorSetLayout)
#define vkDestroyPipeline VK(DestroyPipeline)
#define vkDestroyPipelineLayout VK(DestroyPipelineLayout)
#define vkDestroyShaderModule VK(DestroyShaderModule)
#define vkEndCommandBuffer VK(EndCommandBuffer)
#define vkFreeCommandBuffers VK(FreeCommandBuffers)
#define vkFreeMemory VK(FreeMemory)
#define vkGetBufferMemoryRequirements VK(GetBufferMemoryRequirements)
#define vkGetPhysicalDeviceMemoryProperties VK(GetPhysicalDeviceMemoryProperties)
#define vkGetPhysicalDeviceProperties VK(GetPhysicalDeviceProperties)
#define vkMapMemory VK(MapMemory)
#define vkQueueSubmit VK(QueueSubmit)
#define vkResetFences VK(ResetFences)
#define vkUnmapMemory VK(UnmapMemory)
#define vkUpdateDescriptorSets VK(UpdateDescriptorSets)
#define vkWaitForFences VK(WaitForFences)

#define VKFFT_BACKEND 0
#include "vkFFT.h"

struct dspk__vkfft {
  VkFFTApplication app;
  VkFFTConfiguration cfg;
  uint64_t bufsize, insize;
  VkBuffer buf, inbuf;
};

int dspk__vkfft_create(struct dspk__dev *d, VkFence *fence,
                       const struct dspk__vkfft_desc *desc, const void *bin,
                       size_t binlen, struct dspk__vkfft **out, void **save,
                       size_t *savelen) {
  (void)binlen;
  struct dspk__vkfft *f = calloc(1, sizeof *f);
  if (!f)
    return DSPK_ENOMEM;
  VkFFTConfiguration *c = &f->cfg;
  c->FFTdim = 1;
  c->size[0] = desc->n;
  c->numberBatches = desc->batch;
  c->physicalDevice = &d->pd;
  c->device = &d->dev;
  c->queue = &d->queue;
  c->commandPool = &d->cpool;
  c->fence = fence;
  c->isCompilerInitialized = 1; /* the backend initialised glslang */
  c->doublePrecision = desc->dbl;
  c->normalize = 1; /* numpy.fft.ifft scales by 1/n */
  c->specifyOffsetsAtLaunch = 1;
  f->bufsize = desc->bufsize;
  f->buf = desc->buf;
  c->buffer = &f->buf;
  c->bufferSize = &f->bufsize;
  if (desc->r2c) {
    c->performR2C = 1;
    c->isInputFormatted = 1;
    f->insize = desc->insize;
    f->inbuf = desc->inbuf;
    c->inputBuffer = &f->inbuf;
    c->inputBufferSize = &f->insize;
    c->inputBufferStride[0] = desc->n;
    c->bufferStride[0] = desc->n / 2 + 1;
  }
  if (bin) {
    c->loadApplicationFromString = 1;
    c->loadApplicationString = (void *)bin;
  } else if (save) {
    c->saveApplicationToString = 1;
  }
  VkFFTResult r = initializeVkFFT(&f->app, *c);
  if (r != VKFFT_SUCCESS) {
    deleteVkFFT(&f->app);
    free(f);
    return r == VKFFT_ERROR_MALLOC_FAILED ? DSPK_ENOMEM : -1000 - (int)r;
  }
  if (!bin && save && f->app.saveApplicationString && f->app.applicationStringSize) {
    *save = malloc(f->app.applicationStringSize);
    if (*save) {
      memcpy(*save, f->app.saveApplicationString, f->app.applicationStringSize);
      *savelen = f->app.applicationStringSize;
    }
  }
  *out = f;
  return 0;
}

int dspk__vkfft_append(struct dspk__vkfft *f, VkCommandBuffer cb, int inverse,
                       VkBuffer buf, uint64_t off, VkBuffer inbuf, uint64_t inoff) {
  VkFFTLaunchParams lp;
  memset(&lp, 0, sizeof lp);
  f->buf = buf;
  f->inbuf = inbuf;
  lp.commandBuffer = &cb;
  lp.buffer = &f->buf;
  lp.bufferOffset = off;
  if (f->cfg.isInputFormatted) {
    lp.inputBuffer = &f->inbuf;
    lp.inputBufferOffset = inoff;
  }
  VkFFTResult r = VkFFTAppend(&f->app, inverse ? 1 : -1, &lp);
  return r == VKFFT_SUCCESS ? 0 : -1000 - (int)r;
}

int dspk__vkfft_version(void) { return VkFFTGetVersion(); }

void dspk__vkfft_destroy(struct dspk__vkfft *f) {
  if (!f)
    return;
  deleteVkFFT(&f->app);
  free(f);
}
