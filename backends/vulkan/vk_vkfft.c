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
  uint64_t bufsize, insize, tempsize;
  /* VkFFT notices new buffers by comparing the pointers it is given, not
   * the handles: a launch on other buffers passes the other slot. */
  VkBuffer bufs[2], inbufs[2];
  int slot;
  VkBuffer temp;
};

/* A VkFFT save is a sequence of (uint32 byte count, that many bytes of
 * SPIR-V) records: checks that bin is exactly that, so that a damaged
 * cache entry is refused instead of read past its end. */
static int save_ok(const void *bin, size_t len) {
  const uint8_t *p = bin;
  size_t at = 0;
  if (len == 0 || len % 4)
    return 0;
  while (at < len) {
    uint32_t n;
    memcpy(&n, p + at, 4);
    if (n == 0 || n % 4 || n > len - at - 4)
      return 0;
    at += 4 + n;
  }
  return 1;
}

int dspk__vkfft_create(struct dspk__dev *d, VkFence *fence,
                       const struct dspk__vkfft_desc *desc, const void *bin,
                       size_t binlen, struct dspk__vkfft **out, void **save,
                       size_t *savelen) {
  if (bin && !save_ok(bin, binlen))
    return DSPK_EINVAL;
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
  c->coalescedMemory = desc->tune.coalesced;
  c->aimThreads = desc->tune.aim_threads;
  c->registerBoost = desc->tune.reg_boost;
  c->performBandwidthBoost = desc->tune.bw_boost;
  c->useLUT = desc->tune.lut;
  f->bufsize = desc->bufsize;
  f->bufs[0] = desc->buf;
  c->buffer = &f->bufs[0];
  c->bufferSize = &f->bufsize;
  if (desc->r2c || desc->oop) {
    c->isInputFormatted = 1;
    f->insize = desc->insize;
    f->inbufs[0] = desc->inbuf;
    c->inputBuffer = &f->inbufs[0];
    c->inputBufferSize = &f->insize;
  }
  if (desc->r2c) {
    c->performR2C = 1;
    /* Each row its own transform: VkFFT would otherwise merge two real rows
     * into one complex transform (even batch), so that a NaN or an infinity
     * of one row made every output of the other non-finite, and a row of
     * 1e-20 next to one of 1e20 came out as the other's rounding error.
     * (The plan key says so: vk_fft.c, plan_key.) */
    c->disableMergeSequencesR2C = 1;
    /* Only ever run forward (an inverse of real input is refused before,
     * vk_fft.c): no inverse plan.  Its forward plan would borrow the
     * inverse's twiddle table and leak its own (VkFFT 1.2's
     * VkFFTPlanR2CMultiUploadDecomposition: 8 bytes a point of every f64
     * plan made; LeakSanitizer caught it). */
    c->makeForwardPlanOnly = 1;
    c->inputBufferStride[0] = desc->n;
    c->bufferStride[0] = desc->n / 2 + 1;
  }
  if (desc->temp) {
    c->userTempBuffer = 1;
    f->temp = desc->temp;
    f->tempsize = desc->tempsize;
    c->tempBuffer = &f->temp;
    c->tempBufferSize = &f->tempsize;
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

int dspk__vkfft_bound(const struct dspk__vkfft *f, VkBuffer buf, VkBuffer inbuf) {
  return f->bufs[f->slot] == buf && (!f->cfg.isInputFormatted || f->inbufs[f->slot] == inbuf);
}

int dspk__vkfft_append(struct dspk__vkfft *f, VkCommandBuffer cb, int inverse,
                       VkBuffer buf, uint64_t off, VkBuffer inbuf, uint64_t inoff) {
  VkFFTLaunchParams lp;
  memset(&lp, 0, sizeof lp);
  if (!dspk__vkfft_bound(f, buf, inbuf)) {
    f->slot ^= 1;
    f->bufs[f->slot] = buf;
    f->inbufs[f->slot] = f->cfg.isInputFormatted ? inbuf : VK_NULL_HANDLE;
  }
  lp.commandBuffer = &cb;
  lp.buffer = &f->bufs[f->slot];
  lp.bufferOffset = off;
  if (f->cfg.isInputFormatted) {
    lp.inputBuffer = &f->inbufs[f->slot];
    lp.inputBufferOffset = inoff;
  }
  VkFFTResult r = VkFFTAppend(&f->app, inverse ? 1 : -1, &lp);
  return r == VKFFT_SUCCESS ? 0 : -1000 - (int)r;
}

static int axis_split(const VkFFTAxis *a) {
  const uint64_t *w = a->specializationConstants.performWorkGroupShift;
  return w[0] || w[1] || w[2];
}

static int plan_split(const VkFFTPlan *p) {
  if (!p)
    return 0;
  for (int ax = 0; ax < 3; ax++)
    for (uint64_t l = 0; l < p->numAxisUploads[ax] && l < 4; l++)
      if (axis_split(&p->axes[ax][l]) || axis_split(&p->inverseBluesteinAxes[ax][l]))
        return 1;
  return axis_split(&p->R2Cdecomposition);
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return b ? (a + b - 1) / b : a; }

/* Whether VkFFTAppend splits a dispatch of axis 0's uploads of plan p: the
 * workgroups it dispatches, as its code (1.2.26) computes them, against
 * the device's maxComputeWorkGroupCount.  (performWorkGroupShift says less:
 * VkFFT sets it for a batch above that count whatever the rows a workgroup
 * takes, which would halve batches of short rows for nothing.) */
static int axis0_split(const VkFFTApplication *app, const VkFFTPlan *p) {
  const VkFFTConfiguration *c = &app->configuration;
  uint64_t nu = p->numAxisUploads[0], s0 = p->actualFFTSizePerAxis[0][0],
           s1 = p->actualFFTSizePerAxis[0][1];
  for (uint64_t l = 0; l < nu && l < 4; l++) {
    const VkFFTAxis *a = &p->axes[0][l];
    uint64_t fd = a->specializationConstants.fftDim, db[3];
    if (!fd)
      return 1;
    if (l == 0 && nu > 2) {
      uint64_t sp = p->axisSplit[0][1] ? p->axisSplit[0][1] : 1;
      db[0] = ceil_div(ceil_div(s0 / fd, a->axisBlock[1]), sp) * sp;
      db[1] = s1;
    } else if (l == 0 && nu > 1) {
      db[0] = ceil_div(s0 / fd, a->axisBlock[1]);
      db[1] = s1;
    } else if (l == 0) {
      db[0] = s0 / fd;
      db[1] = ceil_div(s1, a->axisBlock[1]);
    } else {
      db[0] = ceil_div(s0 / fd, a->axisBlock[0]);
      db[1] = s1;
    }
    db[2] = p->actualFFTSizePerAxis[0][2] * c->coordinateFeatures * c->numberBatches;
    if (a->specializationConstants.mergeSequencesR2C == 1)
      db[1] = ceil_div(db[1], 2);
    for (int i = 0; i < 3; i++)
      if (db[i] > c->maxComputeWorkGroupCount[i])
        return 1;
  }
  return 0;
}

int dspk__vkfft_split(const struct dspk__vkfft *f) {
  const VkFFTApplication *app = &f->app;
  /* Paths whose dispatches are not computed above (VkFFT's own Bluestein,
   * real transforms decomposed in several uploads, more than one axis):
   * any workgroup shift at all counts. */
  if (app->configuration.FFTdim != 1 || app->useBluesteinFFT[0] ||
      (app->localFFTPlan && app->localFFTPlan->multiUploadR2C) ||
      (app->localFFTPlan_inverse && app->localFFTPlan_inverse->multiUploadR2C))
    return plan_split(app->localFFTPlan) || plan_split(app->localFFTPlan_inverse);
  return (app->localFFTPlan && axis0_split(app, app->localFFTPlan)) ||
         (app->localFFTPlan_inverse && axis0_split(app, app->localFFTPlan_inverse));
}

int dspk__vkfft_temp(const struct dspk__vkfft *f, VkBuffer *temp, uint64_t *size) {
  if (!f->app.configuration.allocateTempBuffer || !f->app.configuration.tempBuffer)
    return 0;
  *temp = f->app.configuration.tempBuffer[0];
  *size = f->app.configuration.tempBufferSize[0];
  return 1;
}

int dspk__vkfft_passes(const struct dspk__vkfft *f) {
  const VkFFTPlan *p = f->app.localFFTPlan ? f->app.localFFTPlan : f->app.localFFTPlan_inverse;
  if (!p)
    return 0;
  return (int)p->numAxisUploads[0] + (p->multiUploadR2C ? 1 : 0);
}

int dspk__vkfft_version(void) { return VkFFTGetVersion(); }

void dspk__vkfft_destroy(struct dspk__vkfft *f) {
  if (!f)
    return;
  deleteVkFFT(&f->app);
  free(f);
}
