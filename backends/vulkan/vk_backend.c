/*
 * The Vulkan backend's table and device lifecycle: probe (open the loader,
 * create the one shared VkInstance, list every physical device with a
 * compute queue as "vulkan:N"), open (VkDevice, compute queue, command pool,
 * timeline semaphore, pools, pipeline cache), close (the ordered teardown
 * that keeps the NVIDIA driver from crashing at exit: wait idle, drain the
 * retirement queue, save and destroy pipelines, free the pool, destroy the
 * device) and shutdown (the instance last).  Also the command-buffer ring
 * and the fences, which are timeline-semaphore values.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <glslang/Include/glslang_c_interface.h>

#include "backends/vulkan/vk.h"
#include "proto/testhook.h"

struct dspk__vkfn dspk__vk;
VkInstance dspk__vk_instance;

#define DSPK__VK_MAX_DEV 16
static void *g_loader;
static VkPhysicalDevice g_pd[DSPK__VK_MAX_DEV];
static int g_ndev;
static int g_glslang;
static uint32_t g_inst_ver; /* the instance's Vulkan version (at most 1.3, which it asks) */

int dspk__vk_err(VkResult r) {
  switch (r) {
  case VK_SUCCESS: return 0;
  case VK_ERROR_OUT_OF_HOST_MEMORY:
  case VK_ERROR_OUT_OF_DEVICE_MEMORY:
  case VK_ERROR_OUT_OF_POOL_MEMORY: return DSPK_ENOMEM;
  case VK_TIMEOUT: return DSPK_ETIMEDOUT;
  default: return DSPK_EDEVICE;
  }
}

/* ---- probe / shutdown ---------------------------------------------------- */

static void unload(void) {
  if (dspk__vk_instance && dspk__vk.DestroyInstance)
    dspk__vk.DestroyInstance(dspk__vk_instance, NULL);
  dspk__vk_instance = NULL;
  /* The loader stays mapped: unloading a driver that may still own threads
   * is what crashes processes at exit. */
  memset(&dspk__vk, 0, sizeof dspk__vk);
  g_ndev = 0;
}

static int load_instance(char *why, size_t whylen) {
  const char *names[] = {"libvulkan.so.1", "libvulkan.so"};
  for (size_t i = 0; i < 2 && !g_loader; i++)
    g_loader = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!g_loader) {
    snprintf(why, whylen, "Vulkan loader (libvulkan.so.1) not found");
    return DSPK_ENODEV;
  }
  void *sym = dlsym(g_loader, "vkGetInstanceProcAddr");
  if (!sym) {
    snprintf(why, whylen, "libvulkan.so.1 lacks vkGetInstanceProcAddr");
    return DSPK_ENODEV;
  }
  memcpy(&dspk__vk.GetInstanceProcAddr, &sym, sizeof sym);
  dspk__vk.CreateInstance =
      (PFN_vkCreateInstance)dspk__vk.GetInstanceProcAddr(NULL, "vkCreateInstance");
  dspk__vk.EnumerateInstanceVersion = (PFN_vkEnumerateInstanceVersion)
      dspk__vk.GetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
  uint32_t ver = VK_API_VERSION_1_0;
  if (dspk__vk.EnumerateInstanceVersion)
    dspk__vk.EnumerateInstanceVersion(&ver);
  if (!dspk__vk.CreateInstance || ver < VK_API_VERSION_1_2) {
    snprintf(why, whylen, "Vulkan loader too old (instance version %u.%u, need 1.2)",
             VK_API_VERSION_MAJOR(ver), VK_API_VERSION_MINOR(ver));
    return DSPK_ENODEV;
  }
  g_inst_ver = ver < VK_API_VERSION_1_3 ? ver : VK_API_VERSION_1_3;
  VkApplicationInfo ai = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                          .pApplicationName = "dspkd",
                          .pEngineName = "dspk",
                          .apiVersion = VK_API_VERSION_1_3};
  VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                             .pApplicationInfo = &ai};
  VkResult r = dspk__vk.CreateInstance(&ci, NULL, &dspk__vk_instance);
  if (r != VK_SUCCESS) {
    snprintf(why, whylen, "vkCreateInstance failed (VkResult %d%s)", (int)r,
             r == VK_ERROR_INCOMPATIBLE_DRIVER ? ": no Vulkan driver (ICD) found" : "");
    dspk__vk_instance = NULL;
    return DSPK_ENODEV;
  }
#define DSPK__VK_LOAD(n)                                                       \
  dspk__vk.n = (PFN_vk##n)dspk__vk.GetInstanceProcAddr(dspk__vk_instance, "vk" #n); \
  if (!dspk__vk.n) {                                                           \
    snprintf(why, whylen, "Vulkan loader lacks vk" #n);                        \
    return DSPK_ENODEV;                                                        \
  }
  DSPK__VK_FUNCS(DSPK__VK_LOAD)
#undef DSPK__VK_LOAD
  return 0;
}

static int has_compute_queue(VkPhysicalDevice pd, uint32_t *family) {
  VkQueueFamilyProperties qf[16];
  uint32_t n = 16;
  VK(GetPhysicalDeviceQueueFamilyProperties)(pd, &n, qf);
  int best = -1;
  for (uint32_t i = 0; i < n; i++) {
    if (!(qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || qf[i].queueCount == 0)
      continue;
    /* A compute-only family (async compute) first, else the first. */
    if (best < 0 || !(qf[i].queueFlags & VK_QUEUE_GRAPHICS_BIT))
      if (best < 0 || (qf[best].queueFlags & VK_QUEUE_GRAPHICS_BIT))
        best = (int)i;
  }
  if (best < 0)
    return 0;
  if (family)
    *family = (uint32_t)best;
  return 1;
}

int dspk__vk_has_ext(VkPhysicalDevice pd, const char *name) {
  uint32_t n = 0;
  if (VK(EnumerateDeviceExtensionProperties)(pd, NULL, &n, NULL) != VK_SUCCESS)
    return 0;
  VkExtensionProperties *e = calloc(n ? n : 1, sizeof *e);
  if (!e)
    return 0;
  int found = 0;
  if (VK(EnumerateDeviceExtensionProperties)(pd, NULL, &n, e) == VK_SUCCESS)
    for (uint32_t i = 0; i < n && !found; i++)
      found = strcmp(e[i].extensionName, name) == 0;
  free(e);
  return found;
}

/* Identity strings of a physical device (for devinfo and cache keys). */
static void identity(VkPhysicalDevice pd, char *driver, size_t dlen, char *uuid,
                     char *arch, size_t alen) {
  VkPhysicalDeviceDriverProperties drv = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceIDProperties id = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES, .pNext = &drv};
  VkPhysicalDeviceProperties2 p2 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &id};
  VK(GetPhysicalDeviceProperties2)(pd, &p2);
  const VkPhysicalDeviceProperties *p = &p2.properties;
  uint32_t v = p->driverVersion;
  char num[32];
  if (p->vendorID == 0x10de)
    snprintf(num, sizeof num, "%u.%u.%u", (v >> 22) & 0x3ff, (v >> 14) & 0xff,
             (v >> 6) & 0xff);
  else
    snprintf(num, sizeof num, "%u.%u.%u", VK_API_VERSION_MAJOR(v),
             VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
  snprintf(driver, dlen, "%.20s %.30s", drv.driverName[0] ? drv.driverName : "vulkan",
           drv.driverInfo[0] ? drv.driverInfo : num);
  for (int i = 0; i < 16; i++)
    snprintf(uuid + 2 * i, 3, "%02x", id.deviceUUID[i]);
  snprintf(arch, alen, "vk%u.%u/%04x:%04x", VK_API_VERSION_MAJOR(p->apiVersion),
           VK_API_VERSION_MINOR(p->apiVersion), p->vendorID, p->deviceID);
}

static int vk_probe(struct dspk__devinfo *info, int max, char *why, size_t whylen) {
  char tmp[8];
  if (!why || !whylen) {
    why = tmp;
    whylen = sizeof tmp;
  }
  why[0] = 0;
  if (!dspk__vk_instance) {
    if (load_instance(why, whylen) != 0) {
      unload();
      return 0;
    }
    uint32_t n = 0;
    VkPhysicalDevice all[DSPK__VK_MAX_DEV];
    n = DSPK__VK_MAX_DEV;
    VkResult r = VK(EnumeratePhysicalDevices)(dspk__vk_instance, &n, all);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
      n = 0;
    g_ndev = 0;
    for (uint32_t i = 0; i < n; i++) {
      VkPhysicalDeviceProperties p;
      VK(GetPhysicalDeviceProperties)(all[i], &p);
      if (p.apiVersion < VK_API_VERSION_1_2 || !has_compute_queue(all[i], NULL) ||
          !dspk__vk_has_ext(all[i], VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME))
        continue;
      g_pd[g_ndev++] = all[i];
    }
    if (g_ndev == 0) {
      snprintf(why, whylen, n ? "no Vulkan 1.2 device with a compute queue and "
                                "VK_KHR_push_descriptor"
                              : "no Vulkan device");
      unload();
      return 0;
    }
    if (!g_glslang)
      g_glslang = glslang_initialize_process();
  }
  for (int i = 0; i < g_ndev && i < max; i++) {
    struct dspk__devinfo *o = &info[i];
    VkPhysicalDeviceProperties p;
    VkPhysicalDeviceMemoryProperties mp;
    VK(GetPhysicalDeviceProperties)(g_pd[i], &p);
    VK(GetPhysicalDeviceMemoryProperties)(g_pd[i], &mp);
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%.127s", p.deviceName);
    const char *t = "other";
    switch (p.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: t = "discrete"; break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: t = "integrated"; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: t = "virtual"; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: t = "cpu"; o->software = 1; break;
    default: break;
    }
    snprintf(o->type, sizeof o->type, "%s", t);
    identity(g_pd[i], o->driver, sizeof o->driver, o->uuid, o->arch, sizeof o->arch);
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
      if (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
        o->memory += mp.memoryHeaps[h].size;
    /* Every operand and result of a task is one storage-buffer binding. */
    o->max_tensor_bytes = dspk__vk_max_tensor_bytes(&p.limits);
  }
  return g_ndev;
}

static void vk_shutdown(void) {
  if (g_glslang)
    glslang_finalize_process();
  g_glslang = 0;
  unload();
}

/* ---- command buffers and fences ------------------------------------------ */

static int value_reached(struct dspk__dev *d, uint64_t v);

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Waits until the timeline reaches v.  On a GPU it first polls the counter
 * for up to d->spin_ns: a blocking vkWaitSemaphores woke 30-90 us after
 * the work ended on the H200 (docs/performance.md, "One task at a time"),
 * as much as a small task's whole work; CUDA's default synchronization
 * spins alike.  Work that runs longer costs that much of the runner's core
 * per wait, then the wait blocks. */
int dspk__vk_wait_value(struct dspk__dev *d, uint64_t v) {
  if (v == 0)
    return 0;
  if (d->spin_ns) {
    uint64_t end = mono_ns() + d->spin_ns;
    do {
      int r = value_reached(d, v);
      if (r != 0)
        return r < 0 ? r : 0;
    } while (mono_ns() < end);
  }
  VkSemaphoreWaitInfo wi = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                            .semaphoreCount = 1,
                            .pSemaphores = &d->timeline,
                            .pValues = &v};
  return dspk__vk_err(VK(WaitSemaphores)(d->dev, &wi, UINT64_MAX));
}

static int value_reached(struct dspk__dev *d, uint64_t v) {
  uint64_t cur = 0;
  if (v == 0)
    return 1;
  VkResult r = VK(GetSemaphoreCounterValue)(d->dev, d->timeline, &cur);
  if (r != VK_SUCCESS)
    return dspk__vk_err(r);
  return cur >= v;
}

void dspk__vk_barrier(struct dspk__dev *d) {
  if (!d->rec)
    return;
  VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT |
                                         VK_ACCESS_TRANSFER_WRITE_BIT |
                                         VK_ACCESS_HOST_WRITE_BIT,
                        .dstAccessMask = VK_ACCESS_SHADER_READ_BIT |
                                         VK_ACCESS_SHADER_WRITE_BIT |
                                         VK_ACCESS_TRANSFER_READ_BIT |
                                         VK_ACCESS_TRANSFER_WRITE_BIT |
                                         VK_ACCESS_HOST_READ_BIT |
                                         VK_ACCESS_INDIRECT_COMMAND_READ_BIT};
  VK(CmdPipelineBarrier)(d->rec,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                             VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                             VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT |
                             VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT,
                         0, 1, &mb, 0, NULL, 0, NULL);
}

int dspk__vk_cmd(struct dspk__dev *d, VkCommandBuffer *out) {
  if (d->rec) {
    *out = d->rec;
    return 0;
  }
  struct dspk__vk_cmd *s = &d->ring[d->ring_next];
  int r = dspk__vk_wait_value(d, s->value);
  if (r)
    return r;
  VkResult vr;
  if (!s->cb) {
    VkCommandBufferAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = d->cpool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1};
    if ((vr = VK(AllocateCommandBuffers)(d->dev, &ai, &s->cb)) != VK_SUCCESS) {
      s->cb = NULL;
      return dspk__vk_err(vr);
    }
  } else if ((vr = VK(ResetCommandBuffer)(s->cb, 0)) != VK_SUCCESS) {
    return dspk__vk_err(vr);
  }
  VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                 .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
  if ((vr = VK(BeginCommandBuffer)(s->cb, &bi)) != VK_SUCCESS)
    return dspk__vk_err(vr);
  d->rec = s->cb;
  d->rec_slot = s;
  d->ring_next = (d->ring_next + 1) % DSPK__VK_RING;
  /* Order this buffer's work after every earlier submission's writes. */
  dspk__vk_barrier(d);
  *out = d->rec;
  return 0;
}

int dspk__vk_piece_end(struct dspk__dev *d, struct dspk__opctx *ctx, const char *cancel_after,
                       int *npieces) {
  uint64_t prev = d->submitted;
  int r = dspk__vk_submit(d);
  if (r || (prev && (r = dspk__vk_wait_value(d, prev))))
    return r;
  ++*npieces;
  if (cancel_after && ctx && ctx->cancel && *npieces >= atoi(cancel_after))
    atomic_store(ctx->cancel, 1);
  return ctx && ctx->cancel && atomic_load(ctx->cancel) ? DSPK_ECANCELED : 0;
}

int dspk__vk_submit(struct dspk__dev *d) {
  if (!d->rec)
    return 0;
  VkCommandBuffer cb = d->rec;
  d->rec = NULL;
  VkResult vr = VK(EndCommandBuffer)(cb);
  if (vr != VK_SUCCESS) {
    d->rec_slot->value = d->submitted;
    return dspk__vk_err(vr);
  }
  uint64_t v = d->submitted + 1;
  VkTimelineSemaphoreSubmitInfo ts = {
      .sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
      .signalSemaphoreValueCount = 1,
      .pSignalSemaphoreValues = &v};
  VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                     .pNext = &ts,
                     .commandBufferCount = 1,
                     .pCommandBuffers = &cb,
                     .signalSemaphoreCount = 1,
                     .pSignalSemaphores = &d->timeline};
  vr = VK(QueueSubmit)(d->queue, 1, &si, VK_NULL_HANDLE);
  if (vr != VK_SUCCESS) {
    d->rec_slot->value = d->submitted;
    return dspk__vk_err(vr);
  }
  d->submitted = v;
  d->rec_slot->value = v;
  return 0;
}

/* Fences are timeline values, carried in the pointer itself: nothing to
 * allocate or free.  Value 0 (nothing submitted yet) is always reached. */
static int vk_fence_record(struct dspk__dev *d, struct dspk__fence **out) {
  int r = dspk__vk_submit(d);
  if (r)
    return r;
  *out = (struct dspk__fence *)(uintptr_t)d->submitted;
  return 0;
}
static int vk_fence_query(struct dspk__dev *d, struct dspk__fence *f) {
  return value_reached(d, (uint64_t)(uintptr_t)f);
}
static int vk_fence_wait(struct dspk__dev *d, struct dspk__fence *f) {
  return dspk__vk_wait_value(d, (uint64_t)(uintptr_t)f);
}
static void vk_fence_destroy(struct dspk__dev *d, struct dspk__fence *f) {
  (void)d;
  (void)f;
}
static int vk_sync(struct dspk__dev *d) {
  int r = dspk__vk_submit(d);
  if (r == 0)
    r = dspk__vk_wait_value(d, d->submitted);
  if (r == 0)
    dspk__retire_drain(&d->retire);
  return r;
}

/* The retirement queue's fence vtable over the same timeline values. */
static int rt_record(void *ud, void **fence) {
  struct dspk__dev *d = ud;
  if (dspk__vk_submit(d) != 0)
    return DSPK_EDEVICE;
  *fence = (void *)(uintptr_t)d->submitted;
  return 0;
}
static int rt_query(void *ud, void *fence) {
  return value_reached(ud, (uint64_t)(uintptr_t)fence);
}
static int rt_wait(void *ud, void *fence) {
  return dspk__vk_wait_value(ud, (uint64_t)(uintptr_t)fence);
}
static int rt_barrier(void *ud) {
  struct dspk__dev *d = ud;
  return dspk__vk_err(VK(QueueWaitIdle)(d->queue));
}
static const struct dspk__retire_ops rt_ops = {
    .record = rt_record, .query = rt_query, .wait = rt_wait, .destroy = NULL,
    .barrier = rt_barrier};

/* Plans start with an int kind: 0 contract (plain memory), 1 fft,
 * 2 Bluestein fft, 3 an fft tuning decision, 4 our own fft kernels,
 * 5 fir's overlap-save workspace (vk_fir.c). */
static void plan_evict(void *ud, void *plan) {
  if (*(int *)plan == 5)
    dspk__vk_fir_ws_free(ud, plan);
  else if (*(int *)plan != 0)
    dspk__vk_fft_plan_free(ud, plan);
  else
    free(plan);
}

/* ---- open / close --------------------------------------------------------- */

static void vk_close(struct dspk__dev *d);

/* The capabilities a raw kernel may declare on d: those of the features
 * the device is created with (f: the supported core features; f11, e12:
 * the enabled 1.1 and 1.2 ones), and the subgroup operations it supports
 * in compute shaders, which need no enabling (vk.h, kcaps). */
static void kcaps_enabled(struct dspk__dev *d, const VkPhysicalDeviceFeatures *f,
                          const VkPhysicalDeviceVulkan11Features *f11,
                          const VkPhysicalDeviceVulkan12Features *e12) {
  VkPhysicalDeviceSubgroupProperties sg = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                    .pNext = &sg};
  VK(GetPhysicalDeviceProperties2)(d->pd, &p2);
  struct {
    uint32_t cap;
    int on;
  } t[] = {{0, 1}, /* Matrix */
           {1, 1}, /* Shader */
           {9, e12->shaderFloat16},
           {10, f->shaderFloat64},
           {11, f->shaderInt64},
           {22, f->shaderInt16},
           {39, e12->shaderInt8},
           {4433, f11->storageBuffer16BitAccess},
           {4448, e12->storageBuffer8BitAccess},
           {5345, e12->vulkanMemoryModel},
           {6022, d->cm.kind == DSPK__VK_CM_KHR},
           {5357, d->cm.kind == DSPK__VK_CM_NV}};
  d->nkcaps = 0;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (t[i].on)
      d->kcaps[d->nkcaps++] = t[i].cap;
  /* GroupNonUniform (61) .. GroupNonUniformQuad (68): the bits of
   * VkSubgroupFeatureFlagBits in that order. */
  if (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT)
    for (uint32_t b = 0; b < 8 && d->nkcaps < DSPK__VK_KCAPS; b++)
      if (sg.supportedOperations & (1u << b))
        d->kcaps[d->nkcaps++] = 61 + b;
}

static int vk_open(int index, const struct dspk__devenv *env, struct dspk__dev **out) {
  if (index < 0 || index >= g_ndev || !dspk__vk_instance)
    return DSPK_ENODEV;
  struct dspk__dev *d = calloc(1, sizeof *d);
  if (!d)
    return DSPK_ENOMEM;
  int r = DSPK_EDEVICE;
  VkResult vr;
  if (env)
    d->env = *env;
  d->index = index;
  d->pd = g_pd[index];
  VK(GetPhysicalDeviceProperties)(d->pd, &d->props);
  VK(GetPhysicalDeviceMemoryProperties)(d->pd, &d->memprops);
  snprintf(d->name, sizeof d->name, "%s", d->props.deviceName);
  identity(d->pd, d->driver, sizeof d->driver, d->uuid, d->arch, sizeof d->arch);
  d->align = d->props.limits.minStorageBufferOffsetAlignment;
  if (d->align < 4)
    d->align = 4;
  has_compute_queue(d->pd, &d->qfamily);

  VkPhysicalDeviceVulkan12Features f12 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, .pNext = &f12};
  VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                  .pNext = &f11};
  VK(GetPhysicalDeviceFeatures2)(d->pd, &f2);
  if (!f12.timelineSemaphore) {
    r = DSPK_ENOTSUP;
    goto fail;
  }
  /* With vulkanMemoryModel enabled, Device memory scope is allowed only
   * when vulkanMemoryModelDeviceScope is enabled too
   * (VUID-RuntimeSpirv-vulkanMemoryModel-06265), and GLSL's atomics
   * (fir's repair flags, vk_ops.c; a client's kernel) use Device scope: the
   * model is enabled only with its Device scope, never alone. */
  VkBool32 memmodel = f12.vulkanMemoryModel && f12.vulkanMemoryModelDeviceScope;
  VkPhysicalDeviceVulkan12Features e12 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
      .timelineSemaphore = VK_TRUE,
      .shaderFloat16 = f12.shaderFloat16,
      .storageBuffer8BitAccess = f12.storageBuffer8BitAccess,
      .vulkanMemoryModel = memmodel,
      .vulkanMemoryModelDeviceScope = memmodel,
      .bufferDeviceAddress = VK_FALSE};
  VkPhysicalDeviceVulkan11Features e11 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
      .pNext = &e12,
      .storageBuffer16BitAccess = f11.storageBuffer16BitAccess};
  VkPhysicalDeviceFeatures2 e2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                  .pNext = &e11};
  e2.features.shaderFloat64 = f2.features.shaderFloat64;
  e2.features.shaderInt64 = f2.features.shaderInt64;
  e2.features.shaderInt16 = f2.features.shaderInt16; /* for raw kernels (kcaps) */
  e12.shaderInt8 = f12.shaderInt8;
  d->has_f64 = f2.features.shaderFloat64;
  d->has_int64 = f2.features.shaderInt64;
  d->has_f16 = f12.shaderFloat16 && f11.storageBuffer16BitAccess;

  const char *exts[10];
  uint32_t next = 0;
  exts[next++] = VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME;
  /* Workgroup memory zeroed for raw kernels (vk_spvzero.c): core in 1.3
   * (the instance asks for 1.3), else the extension. */
  VkPhysicalDeviceZeroInitializeWorkgroupMemoryFeatures fz = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ZERO_INITIALIZE_WORKGROUP_MEMORY_FEATURES};
  int ext_zero = dspk__vk_has_ext(d->pd, VK_KHR_ZERO_INITIALIZE_WORKGROUP_MEMORY_EXTENSION_NAME);
  if (ext_zero || (d->props.apiVersion >= VK_API_VERSION_1_3 && g_inst_ver >= VK_API_VERSION_1_3)) {
    VkPhysicalDeviceFeatures2 q = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                   .pNext = &fz};
    VK(GetPhysicalDeviceFeatures2)(d->pd, &q);
    if (fz.shaderZeroInitializeWorkgroupMemory) {
      d->zero_wg = 1;
      fz.pNext = e2.pNext;
      e2.pNext = &fz;
      if (ext_zero && !(d->props.apiVersion >= VK_API_VERSION_1_3 &&
                        g_inst_ver >= VK_API_VERSION_1_3))
        exts[next++] = VK_KHR_ZERO_INITIALIZE_WORKGROUP_MEMORY_EXTENSION_NAME;
    }
  }
  /* Shared-memory buffers in place (import_host), where offered. */
  int ext_host = dspk__vk_has_ext(d->pd, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  if (ext_host)
    exts[next++] = VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME;
  /* Raw kernels bounded to their tensors with robustBufferAccess2's
   * behaviour, which checks each access against its descriptor's range
   * (robustBufferAccess alone may reach anywhere in the VkBuffer, which
   * holds other users' blocks): asked per pipeline (make_pipeline) where
   * the device has pipeline robustness, so that the daemon's own kernels
   * run unchecked; else, where it has robustBufferAccess2, for the whole
   * device (every kernel checked: safety first). */
  VkPhysicalDeviceRobustness2FeaturesEXT fr2 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT};
  VkPhysicalDevicePipelineRobustnessFeaturesEXT fpr = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_ROBUSTNESS_FEATURES_EXT};
  if (dspk__vk_has_ext(d->pd, VK_EXT_ROBUSTNESS_2_EXTENSION_NAME)) {
    int ext_pr = dspk__vk_has_ext(d->pd, VK_EXT_PIPELINE_ROBUSTNESS_EXTENSION_NAME);
    fpr.pNext = &fr2;
    VkPhysicalDeviceFeatures2 q = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                   .pNext = ext_pr ? (void *)&fpr : (void *)&fr2};
    VK(GetPhysicalDeviceFeatures2)(d->pd, &q);
    if (fr2.robustBufferAccess2 && ext_pr && fpr.pipelineRobustness) {
      d->robust_raw = 1;
      exts[next++] = VK_EXT_PIPELINE_ROBUSTNESS_EXTENSION_NAME;
      exts[next++] = VK_EXT_ROBUSTNESS_2_EXTENSION_NAME;
      fpr = (VkPhysicalDevicePipelineRobustnessFeaturesEXT){
          .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_ROBUSTNESS_FEATURES_EXT,
          .pNext = e2.pNext,
          .pipelineRobustness = VK_TRUE};
      e2.pNext = &fpr;
    } else if (fr2.robustBufferAccess2 && f2.features.robustBufferAccess) {
      d->robust_raw = 2;
      exts[next++] = VK_EXT_ROBUSTNESS_2_EXTENSION_NAME;
      fr2 = (VkPhysicalDeviceRobustness2FeaturesEXT){
          .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ROBUSTNESS_2_FEATURES_EXT,
          .pNext = e2.pNext,
          .robustBufferAccess2 = VK_TRUE};
      e2.pNext = &fr2;
      e2.features.robustBufferAccess = VK_TRUE; /* robustBufferAccess2 requires it */
    }
  }
  /* The cooperative-matrix gemm path: its extension and feature (vk_coopmat.c). */
  dspk__vk_coopmat_setup(d, d->has_f16 && memmodel, exts, &next, &e12.pNext);
  kcaps_enabled(d, &f2.features, &f11, &e12);
  float prio = 1.0f;
  VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                .queueFamilyIndex = d->qfamily,
                                .queueCount = 1,
                                .pQueuePriorities = &prio};
  VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                           .pNext = &e2,
                           .queueCreateInfoCount = 1,
                           .pQueueCreateInfos = &qi,
                           .enabledExtensionCount = next,
                           .ppEnabledExtensionNames = exts};
  if ((vr = VK(CreateDevice)(d->pd, &di, NULL, &d->dev)) != VK_SUCCESS) {
    d->dev = NULL;
    r = dspk__vk_err(vr);
    goto fail;
  }
  VK(GetDeviceQueue)(d->dev, d->qfamily, 0, &d->queue);
  if (ext_host) {
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &hp};
    VK(GetPhysicalDeviceProperties2)(d->pd, &p2);
    d->GetMemoryHostPointerPropertiesEXT = (PFN_vkGetMemoryHostPointerPropertiesEXT)VK(
        GetDeviceProcAddr)(d->dev, "vkGetMemoryHostPointerPropertiesEXT");
    d->host_import_align = d->GetMemoryHostPointerPropertiesEXT
                               ? hp.minImportedHostPointerAlignment : 0;
  }
  d->CmdPushDescriptorSetKHR = (PFN_vkCmdPushDescriptorSetKHR)VK(GetDeviceProcAddr)(
      d->dev, "vkCmdPushDescriptorSetKHR");
  if (!d->CmdPushDescriptorSetKHR) {
    r = DSPK_ENOTSUP;
    goto fail;
  }
  VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                .queueFamilyIndex = d->qfamily};
  if ((vr = VK(CreateCommandPool)(d->dev, &pi, NULL, &d->cpool)) != VK_SUCCESS) {
    d->cpool = VK_NULL_HANDLE;
    r = dspk__vk_err(vr);
    goto fail;
  }
  VkSemaphoreTypeCreateInfo st = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
                                  .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE,
                                  .initialValue = 0};
  VkSemaphoreCreateInfo sci = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO,
                               .pNext = &st};
  if ((vr = VK(CreateSemaphore)(d->dev, &sci, NULL, &d->timeline)) != VK_SUCCESS) {
    d->timeline = VK_NULL_HANDLE;
    r = dspk__vk_err(vr);
    goto fail;
  }
  /* A lavapipe device computes on the CPU: polling would take a core from
   * its own threads.  DSPK_VK_SPIN_US (test builds): another bound, for
   * benchmarks. */
  d->spin_ns = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 0 : DSPK__VK_SPIN_NS;
  const char *spin_us = DSPK_TEST_HOOK("DSPK_VK_SPIN_US");
  if (spin_us)
    d->spin_ns = (uint64_t)strtoull(spin_us, NULL, 10) * 1000u;
  if ((r = dspk__vk_mem_init(d)))
    goto fail;
  if ((r = dspk__retire_init(&d->retire, &rt_ops, d, 0)))
    goto fail;
  if ((r = dspk__plancache_init(&d->plans, 0, plan_evict, d)))
    goto fail;
  if ((r = dspk__vk_pcache_init(d)))
    goto fail;
  *out = d;
  return 0;
fail:
  vk_close(d);
  return r;
}

/* The ordered teardown (see the file comment). */
static void vk_close(struct dspk__dev *d) {
  if (!d)
    return;
  dspk__kcompile_spare_end(&d->kspare);
  dspk__kcompile_spare_end(&d->pspare);
  if (d->dev) {
    dspk__vk_submit(d);
    VK(DeviceWaitIdle)(d->dev);
  }
  /* Plans first: freeing them hands their buffers to the retirement
   * queue, which is drained next. */
  dspk__plancache_fini(&d->plans);
  dspk__retire_fini(&d->retire);
  if (d->dev) {
    if (d->fft_fence)
      VK(DestroyFence)(d->dev, d->fft_fence, NULL);
    dspk__vk_kernels_fini(d);
    dspk__vk_pcache_fini(d);
    dspk__vk_mem_fini(d);
    for (int i = 0; i < DSPK__VK_RING; i++)
      if (d->ring[i].cb)
        VK(FreeCommandBuffers)(d->dev, d->cpool, 1, &d->ring[i].cb);
    if (d->cpool)
      VK(DestroyCommandPool)(d->dev, d->cpool, NULL);
    if (d->timeline)
      VK(DestroySemaphore)(d->dev, d->timeline, NULL);
    VK(DestroyDevice)(d->dev, NULL);
  }
  free(d);
}

/* The daemon's blocks (buffers, a task's inline operands).  A shader reads
 * a tensor through a binding rounded up to 4 bytes (dspk__vk_bind_tensor):
 * the bytes past n in its last word are zeroed here, so that they never
 * show what an earlier block at that place held (the daemon zeroes or
 * writes the first n). */
static int vk_alloc(struct dspk__dev *d, size_t n, struct dspk__mem **out) {
  struct dspk__mem *m;
  int r = dspk__vk_alloc(d, n, &m);
  if (r)
    return r;
  if (n % 4 && (r = dspk__vk_zero(d, m, n & ~(size_t)3, 4))) {
    dspk__vk_free(d, m);
    return r;
  }
  *out = m;
  return 0;
}
static void vk_free(struct dspk__dev *d, struct dspk__mem *m) { dspk__vk_free(d, m); }

/* The runner is idle: what the retirement queue holds follows work already
 * submitted, so waiting on its timeline values ends with that work. */
static void vk_settle(struct dspk__dev *d) {
  if (d->retire.n)
    dspk__retire_sync(&d->retire);
}

/* No client for idle_trim: the pools' free lists go back to the driver
 * (retired blocks first join them). */
static void vk_trim(struct dspk__dev *d) {
  vk_settle(d);
  dspk__pool_trim(&d->pool);
  dspk__pool_trim(&d->hpool);
}

static void vk_stats(struct dspk__dev *d, struct dspk__devstats *out) {
  dspk__pool_stats_fill(&d->pool, out);
  dspk__retire_stats_fill(&d->retire, out);
  out->kernels_compiled = d->kernels_compiled;
  out->kernel_cache_hits = d->kernel_cache_hits;
}

/* Every op, f16 and bf16 gemm on every device (the cooperative-matrix
 * path where offered, else the scalar kernel); f64 and c128 only with
 * shaderFloat64; fft only in a build with VkFFT; raw kernels in GLSL and
 * SPIR-V. */
static void vk_caps(struct dspk__dev *d, struct dspk__devcaps *out) {
  /* The ops of dspk__vk_run's switch (vk_ops.c). */
  dspk__caps_add_ops(out, DSPK__CAPS_OP(GEMM) | DSPK__CAPS_OP(FFT) | DSPK__CAPS_OP(FIR) |
                              DSPK__CAPS_OP(CONTRACT) | DSPK__CAPS_OP(REDUCE) |
                              DSPK__CAPS_OP(MAP));
  if (!d->has_f64) {
    dspk__caps_drop_dtype(out, DSPK_F64);
    dspk__caps_drop_dtype(out, DSPK_C128);
  }
  if (!dspk__vk_fft_built)
    out->dtypes[DSPK_OP_FFT] = 0;
  dspk__caps_add_lang(out, "glsl");
  dspk__caps_add_lang(out, "spirv");
}

const struct dspk__backend dspk__backend_vulkan = {
    .name = "vulkan",
    .probe = vk_probe,
    .shutdown = vk_shutdown,
    .open = vk_open,
    .close = vk_close,
    .alloc = vk_alloc,
    .free = vk_free,
    .write = dspk__vk_write,
    .read = dspk__vk_read,
    .import_host = dspk__vk_import_host,
    .host_register = dspk__vk_host_register,
    .host_unregister = dspk__vk_host_unregister,
    .fence_record = vk_fence_record,
    .fence_query = vk_fence_query,
    .fence_wait = vk_fence_wait,
    .fence_destroy = vk_fence_destroy,
    .sync = vk_sync,
    .caps = vk_caps,
    .run = dspk__vk_run,
    .trim = vk_trim,
    .settle = vk_settle,
    .stats = vk_stats,
};
