/*
 * Vulkan device memory: the raw allocator under the shared caching pool
 * (backends/common/pool.h), with sub-allocation, and host<->device copies.
 *
 * Blocks below DSPK__VK_SLAB_MAX bytes are slots of a slab: one
 * VkDeviceMemory and one VkBuffer of DSPK__VK_SLAB_BYTES cut into equal
 * slots of the block's (bucketed) size, so thousands of small tensors do not
 * use up maxMemoryAllocationCount.  Larger blocks get their own memory.  A
 * block's handle in the pool is its struct dspk__mem, made once by the raw
 * allocator and reused with the block.
 *
 * Transfers go through host-visible staging blocks (a second pool) and
 * vkCmdCopyBuffer on the device's queue, so they are ordered with the work
 * around them; staging blocks are retired behind the copy.  Where device
 * memory is itself host-visible and host-cached (lavapipe, unified memory)
 * and the queue is idle, the host copies directly.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/vulkan/vk.h"

static void destroy_imported(struct dspk__dev *d, struct dspk__mem *m);
static struct dspk__mem *registered(struct dspk__dev *d, const void *p, size_t n,
                                    VkDeviceSize *off);

#define DSPK__VK_SLAB_BYTES ((VkDeviceSize)16 << 20)
#define DSPK__VK_SLAB_MAX ((size_t)1 << 20)

struct dspk__vk_slab {
  struct dspk__vk_slab *next;
  VkDeviceMemory dm;
  VkBuffer buf;
  void *map;
  VkDeviceSize slot;
  uint32_t nslots, nused;
  uint64_t *used; /* bitmap */
};

/* (indirect: fir's repair takes its group count from a buffer, vk_fir.c) */
static const VkBufferUsageFlags usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                        VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                        VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                        VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT;

/* Makes a buffer of n bytes with its own memory of type `type`, mapped when
 * host-visible. */
static int make_buffer(struct dspk__dev *d, VkDeviceSize n, uint32_t type,
                       VkBuffer *buf, VkDeviceMemory *dm, void **map) {
  VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                           .size = n ? n : 4,
                           .usage = usage,
                           .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
  VkResult vr = VK(CreateBuffer)(d->dev, &bi, NULL, buf);
  if (vr != VK_SUCCESS)
    return dspk__vk_err(vr);
  VkMemoryRequirements mr;
  VK(GetBufferMemoryRequirements)(d->dev, *buf, &mr);
  VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                             .allocationSize = mr.size,
                             .memoryTypeIndex = type};
  if ((vr = VK(AllocateMemory)(d->dev, &ai, NULL, dm)) != VK_SUCCESS)
    goto err_buf;
  if ((vr = VK(BindBufferMemory)(d->dev, *buf, *dm, 0)) != VK_SUCCESS)
    goto err_mem;
  *map = NULL;
  if (d->memprops.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
    if ((vr = VK(MapMemory)(d->dev, *dm, 0, VK_WHOLE_SIZE, 0, map)) != VK_SUCCESS)
      goto err_mem;
  return 0;
err_mem:
  VK(FreeMemory)(d->dev, *dm, NULL);
err_buf:
  VK(DestroyBuffer)(d->dev, *buf, NULL);
  return dspk__vk_err(vr);
}

static int is_coherent(struct dspk__dev *d, uint32_t type) {
  return (d->memprops.memoryTypes[type].propertyFlags &
          VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
}

static int slab_alloc(struct dspk__dev *d, size_t n, struct dspk__mem *m) {
  struct dspk__vk_slab *s;
  for (s = d->slabs; s; s = s->next)
    if (s->slot == n && s->nused < s->nslots)
      break;
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s)
      return DSPK_ENOMEM;
    s->slot = n;
    s->nslots = (uint32_t)(DSPK__VK_SLAB_BYTES / n);
    s->used = calloc((s->nslots + 63) / 64, sizeof(uint64_t));
    int r = s->used ? make_buffer(d, DSPK__VK_SLAB_BYTES, d->devtype_local, &s->buf,
                                  &s->dm, &s->map)
                    : DSPK_ENOMEM;
    if (r) {
      free(s->used);
      free(s);
      return r;
    }
    s->next = d->slabs;
    d->slabs = s;
  }
  for (uint32_t w = 0; w < (s->nslots + 63) / 64; w++) {
    if (s->used[w] == UINT64_MAX)
      continue;
    int b = __builtin_ctzll(~s->used[w]);
    uint32_t i = w * 64 + (uint32_t)b;
    if (i >= s->nslots)
      break;
    s->used[w] |= 1ull << b;
    s->nused++;
    m->slab = s;
    m->buf = s->buf;
    m->off = (VkDeviceSize)i * s->slot;
    m->size = n;
    m->bufsize = DSPK__VK_SLAB_BYTES;
    m->map = s->map ? (char *)s->map + m->off : NULL;
    m->coherent = is_coherent(d, d->devtype_local);
    return 0;
  }
  return DSPK_EINTERNAL; /* nused < nslots guarantees a free slot */
}

static void slab_free(struct dspk__dev *d, struct dspk__mem *m) {
  struct dspk__vk_slab *s = m->slab, **pp;
  uint32_t i = (uint32_t)(m->off / s->slot);
  s->used[i / 64] &= ~(1ull << (i % 64));
  if (--s->nused > 0)
    return;
  for (pp = &d->slabs; *pp != s; pp = &(*pp)->next)
    ;
  *pp = s->next;
  VK(DestroyBuffer)(d->dev, s->buf, NULL);
  VK(FreeMemory)(d->dev, s->dm, NULL);
  free(s->used);
  free(s);
}

/* Raw allocators of the two pools: the handle is a malloc'd dspk__mem. */
static int raw_alloc(struct dspk__dev *d, size_t n, int host, uint64_t *handle) {
  struct dspk__mem *m = calloc(1, sizeof *m);
  if (!m)
    return DSPK_ENOMEM;
  int r;
  m->host = host;
  if (!host && n < DSPK__VK_SLAB_MAX) {
    r = slab_alloc(d, n, m);
  } else {
    uint32_t type = host ? d->devtype_host : d->devtype_local;
    r = make_buffer(d, n, type, &m->buf, &m->dm, &m->map);
    m->size = n;
    m->bufsize = n ? n : 4;
    m->coherent = is_coherent(d, type);
  }
  if (r) {
    free(m);
    return r;
  }
  *handle = (uint64_t)(uintptr_t)m;
  return 0;
}
static void raw_free(struct dspk__dev *d, uint64_t handle) {
  struct dspk__mem *m = (struct dspk__mem *)(uintptr_t)handle;
  if (m->slab) {
    slab_free(d, m);
  } else {
    VK(DestroyBuffer)(d->dev, m->buf, NULL);
    VK(FreeMemory)(d->dev, m->dm, NULL);
  }
  free(m);
}
static int dev_alloc(void *ud, size_t n, uint64_t *h) { return raw_alloc(ud, n, 0, h); }
static int host_alloc(void *ud, size_t n, uint64_t *h) { return raw_alloc(ud, n, 1, h); }
static void any_free(void *ud, uint64_t h) { raw_free(ud, h); }
static const struct dspk__pool_ops dev_ops = {.alloc = dev_alloc, .free = any_free};
static const struct dspk__pool_ops host_ops = {.alloc = host_alloc, .free = any_free};

/* Picks the first memory type (Vulkan lists the best first) with all of
 * `want` among `bits`, preferring one with `prefer` too. */
static int pick_type(struct dspk__dev *d, uint32_t bits, VkMemoryPropertyFlags want,
                     VkMemoryPropertyFlags prefer) {
  int found = -1;
  for (uint32_t i = 0; i < d->memprops.memoryTypeCount; i++) {
    VkMemoryPropertyFlags f = d->memprops.memoryTypes[i].propertyFlags;
    if (!(bits & (1u << i)) || (f & want) != want)
      continue;
    if ((f & prefer) == prefer)
      return (int)i;
    if (found < 0)
      found = (int)i;
  }
  return found;
}

int dspk__vk_mem_init(struct dspk__dev *d) {
  VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                           .size = 4096,
                           .usage = usage,
                           .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
  VkBuffer b;
  VkResult vr = VK(CreateBuffer)(d->dev, &bi, NULL, &b);
  if (vr != VK_SUCCESS)
    return dspk__vk_err(vr);
  VkMemoryRequirements mr;
  VK(GetBufferMemoryRequirements)(d->dev, b, &mr);
  VK(DestroyBuffer)(d->dev, b, NULL);
  int local = pick_type(d, mr.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
  int host = pick_type(d, mr.memoryTypeBits,
                       VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                           VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                       VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  if (host < 0)
    host = pick_type(d, mr.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, 0);
  if (local < 0)
    local = host;
  if (local < 0 || host < 0)
    return DSPK_ENOTSUP;
  d->devtype_local = (uint32_t)local;
  d->devtype_host = (uint32_t)host;
  VkMemoryPropertyFlags lf = d->memprops.memoryTypes[local].propertyFlags;
  d->local_is_host = (lf & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;
  d->local_cached = d->local_is_host && (lf & VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
  dspk__pool_init(&d->pool, &dev_ops, d, (size_t)1 << 30);
  dspk__pool_init(&d->hpool, &host_ops, d, (size_t)256 << 20);
  return 0;
}

void dspk__vk_mem_fini(struct dspk__dev *d) {
  while (d->hostregs) /* mappings the daemon did not unregister */
    dspk__vk_host_unregister(d, d->hostregs->map);
  dspk__pool_fini(&d->pool);
  dspk__pool_fini(&d->hpool);
  /* Blocks the daemon never freed: their slabs go with the device. */
  while (d->slabs) {
    struct dspk__vk_slab *s = d->slabs;
    d->slabs = s->next;
    VK(DestroyBuffer)(d->dev, s->buf, NULL);
    VK(FreeMemory)(d->dev, s->dm, NULL);
    free(s->used);
    free(s);
  }
}

static int pool_alloc(struct dspk__dev *d, struct dspk__pool *p, size_t n,
                      struct dspk__mem **out) {
  struct dspk__pool_block *b;
  dspk__retire_drain(&d->retire);
  int r = dspk__pool_get(p, n, &b);
  if (r == DSPK_ENOMEM && d->retire.n) {
    /* Memory may be waiting behind fences: wait for it and retry once. */
    dspk__retire_sync(&d->retire);
    r = dspk__pool_get(p, n, &b);
  }
  if (r)
    return r;
  struct dspk__mem *m = (struct dspk__mem *)(uintptr_t)b->handle;
  m->pb = b;
  m->asked = n;
  m->freed = 0;
  *out = m;
  return 0;
}

int dspk__vk_alloc(struct dspk__dev *d, size_t n, struct dspk__mem **out) {
  return pool_alloc(d, &d->pool, n, out);
}
int dspk__vk_alloc_host(struct dspk__dev *d, size_t n, struct dspk__mem **out) {
  return pool_alloc(d, &d->hpool, n, out);
}

void dspk__vk_free(struct dspk__dev *d, struct dspk__mem *m) {
  if (!m)
    return;
  if (m->imported) {
    /* The client's pages: unmapped by the daemon when this returns. */
    destroy_imported(d, m);
    return;
  }
  /* A second free of a block not handed out again since (vk.h, freed):
   * ignored.  (One handed out again belongs to its new owner; nothing here
   * can tell a stale pointer from it: backend.h's rule.) */
  if (m->freed)
    return;
  m->freed = 1;
  dspk__retire_push(&d->retire, dspk__pool_put_cb, m->host ? &d->hpool : &d->pool,
                    m->pb);
}

static int queue_idle(struct dspk__dev *d) {
  uint64_t cur = 0;
  if (d->submitted == 0)
    return 1;
  return VK(GetSemaphoreCounterValue)(d->dev, d->timeline, &cur) == VK_SUCCESS &&
         cur >= d->submitted;
}

static void flush(struct dspk__dev *d, struct dspk__mem *m, VkDeviceSize off,
                  VkDeviceSize n, int invalidate) {
  if (m->coherent)
    return;
  VkDeviceSize a = d->props.limits.nonCoherentAtomSize;
  VkDeviceMemory dm = m->slab ? m->slab->dm : m->dm;
  VkDeviceSize base = m->off + off;
  VkDeviceSize lo = base / a * a, hi = (base + n + a - 1) / a * a;
  VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE,
                            .memory = dm,
                            .offset = lo,
                            .size = hi - lo};
  if (invalidate)
    VK(InvalidateMappedMemoryRanges)(d->dev, 1, &mr);
  else
    VK(FlushMappedMemoryRanges)(d->dev, 1, &mr);
}

int dspk__vk_write(struct dspk__dev *d, struct dspk__mem *m, size_t off,
                   const void *src, size_t n) {
  if (off > m->size || n > m->size - off)
    return DSPK_ERANGE;
  if (n == 0)
    return 0;
  if (m->map && d->local_cached && queue_idle(d)) {
    memcpy((char *)m->map + off, src, n);
    flush(d, m, off, n, 0);
    return 0;
  }
  struct dspk__mem *s;
  VkCommandBuffer cb;
  VkDeviceSize hoff;
  int r;
  if (d->hostregs && (s = registered(d, src, n, &hoff))) {
    /* A registered client mapping: the device copies from it, in order
     * with the work around it (as cuMemcpyHtoDAsync from pinned pages). */
    if ((r = dspk__vk_cmd(d, &cb)))
      return r;
    VkBufferCopy c = {.srcOffset = hoff, .dstOffset = m->off + off, .size = n};
    VK(CmdCopyBuffer)(cb, s->buf, m->buf, 1, &c);
    return dspk__vk_submit(d);
  }
  if ((r = dspk__vk_alloc_host(d, n, &s)))
    return r;
  memcpy(s->map, src, n);
  flush(d, s, 0, n, 0);
  if ((r = dspk__vk_cmd(d, &cb))) {
    dspk__vk_free(d, s);
    return r;
  }
  VkBufferCopy c = {.srcOffset = s->off, .dstOffset = m->off + off, .size = n};
  VK(CmdCopyBuffer)(cb, s->buf, m->buf, 1, &c);
  r = dspk__vk_submit(d);
  dspk__vk_free(d, s);
  return r;
}

int dspk__vk_zero(struct dspk__dev *d, struct dspk__mem *m, size_t off, size_t n) {
  if (off % 4 || n % 4 || off > m->size || n > m->size - off)
    return DSPK_ERANGE;
  if (n == 0)
    return 0;
  if (m->map && d->local_cached && queue_idle(d)) {
    memset((char *)m->map + off, 0, n);
    flush(d, m, off, n, 0);
    return 0;
  }
  VkCommandBuffer cb;
  int r = dspk__vk_cmd(d, &cb);
  if (r)
    return r;
  VK(CmdFillBuffer)(cb, m->buf, m->off + off, n, 0);
  return dspk__vk_submit(d);
}

int dspk__vk_read(struct dspk__dev *d, struct dspk__mem *m, size_t off, void *dst,
                  size_t n) {
  if (off > m->size || n > m->size - off)
    return DSPK_ERANGE;
  int r = dspk__vk_submit(d);
  if (r || n == 0)
    return r;
  if (m->map && d->local_cached) {
    if ((r = dspk__vk_wait_value(d, d->submitted)))
      return r;
    flush(d, m, off, n, 1);
    memcpy(dst, (char *)m->map + off, n);
    return 0;
  }
  struct dspk__mem *s;
  VkCommandBuffer cb;
  VkDeviceSize hoff;
  if (d->hostregs && (s = registered(d, dst, n, &hoff))) {
    /* A registered client mapping: the device copies into it. */
    if ((r = dspk__vk_cmd(d, &cb)))
      return r;
    VkBufferCopy c = {.srcOffset = m->off + off, .dstOffset = hoff, .size = n};
    VK(CmdCopyBuffer)(cb, m->buf, s->buf, 1, &c);
    dspk__vk_barrier(d);
    if ((r = dspk__vk_submit(d)) || (r = dspk__vk_wait_value(d, d->submitted)))
      return r;
    flush(d, s, hoff, n, 1);
    return 0;
  }
  if ((r = dspk__vk_alloc_host(d, n, &s)))
    return r;
  if ((r = dspk__vk_cmd(d, &cb)))
    goto out;
  VkBufferCopy c = {.srcOffset = m->off + off, .dstOffset = s->off, .size = n};
  VK(CmdCopyBuffer)(cb, m->buf, s->buf, 1, &c);
  dspk__vk_barrier(d);
  if ((r = dspk__vk_submit(d)) || (r = dspk__vk_wait_value(d, d->submitted)))
    goto out;
  flush(d, s, 0, n, 1);
  memcpy(dst, s->map, n);
out:
  dspk__vk_free(d, s);
  return r;
}

/* ---- shared memory: a client's pages as device memory ---------------------- */

/* A VkBuffer over the client's pages [ptr, ptr + n) through
 * VK_EXT_external_memory_host.  DSPK_ENOTSUP when the device cannot. */
static int import_ptr(struct dspk__dev *d, void *ptr, size_t n, struct dspk__mem **out) {
  VkDeviceSize a = d->host_import_align, len;
  long page = sysconf(_SC_PAGESIZE);
  VkMemoryHostPointerPropertiesEXT hp = {
      .sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
  VkExternalMemoryBufferCreateInfo eb = {
      .sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
      .handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT};
  VkMemoryRequirements mr;
  struct dspk__mem *m;
  VkResult vr;
  uint32_t type = UINT32_MAX;

  if (!a || !d->GetMemoryHostPointerPropertiesEXT || (uintptr_t)ptr % a)
    return DSPK_ENOTSUP;
  /* The import covers whole alignment units; past the mapping's last page
   * there is nothing to touch, so a larger unit cannot be used.  At least
   * whole 4-byte words, which shaders read (dspk__vk_bind_tensor): the bytes
   * past n in the mapping's last page are the file's (or, past its end,
   * zeros that are never written back), so reading them is harmless, and
   * none of them is a tensor's. */
  VkDeviceSize unit = a < 4 ? 4 : a;
  len = (n + unit - 1) / unit * unit;
  if (page <= 0 || len > (n + (size_t)page - 1) / (size_t)page * (size_t)page)
    return DSPK_ENOTSUP;
  if (d->GetMemoryHostPointerPropertiesEXT(
          d->dev, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, ptr, &hp) !=
      VK_SUCCESS)
    return DSPK_ENOTSUP;
  if (!(m = calloc(1, sizeof *m)))
    return DSPK_ENOMEM;
  VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                           .pNext = &eb,
                           .size = len,
                           .usage = usage,
                           .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
  if ((vr = VK(CreateBuffer)(d->dev, &bi, NULL, &m->buf)) != VK_SUCCESS) {
    free(m);
    return dspk__vk_err(vr);
  }
  VK(GetBufferMemoryRequirements)(d->dev, m->buf, &mr);
  for (uint32_t i = 0; i < d->memprops.memoryTypeCount; i++)
    if ((hp.memoryTypeBits & mr.memoryTypeBits & (1u << i)) &&
        (type == UINT32_MAX || is_coherent(d, i)))
      type = i;
  if (type == UINT32_MAX || mr.size > len) {
    VK(DestroyBuffer)(d->dev, m->buf, NULL);
    free(m);
    return DSPK_ENOTSUP;
  }
  VkImportMemoryHostPointerInfoEXT imp = {
      .sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
      .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
      .pHostPointer = ptr};
  VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                             .pNext = &imp,
                             .allocationSize = len,
                             .memoryTypeIndex = type};
  if ((vr = VK(AllocateMemory)(d->dev, &ai, NULL, &m->dm)) != VK_SUCCESS ||
      (vr = VK(BindBufferMemory)(d->dev, m->buf, m->dm, 0)) != VK_SUCCESS) {
    if (m->dm)
      VK(FreeMemory)(d->dev, m->dm, NULL);
    VK(DestroyBuffer)(d->dev, m->buf, NULL);
    free(m);
    return vr == VK_ERROR_INVALID_EXTERNAL_HANDLE ? DSPK_ENOTSUP : dspk__vk_err(vr);
  }
  m->size = n;
  m->bufsize = len;
  m->map = ptr;
  m->coherent = is_coherent(d, type);
  m->imported = 1;
  *out = m;
  return 0;
}

/* Ops use the client's pages in place only where the device's own memory
 * is host memory (lavapipe, integrated GPUs).  On a discrete GPU a shader
 * would read them across the bus at every access (1.2 GB/s measured for a
 * reduce on the H200), so the daemon keeps a device block and the pages are
 * registered instead: copies between them are the device's DMA. */
int dspk__vk_import_host(struct dspk__dev *d, void *ptr, size_t n, struct dspk__mem **out) {
  if (!d->local_is_host)
    return DSPK_ENOTSUP;
  return import_ptr(d, ptr, n, out);
}

static void destroy_imported(struct dspk__dev *d, struct dspk__mem *m) {
  /* Nothing enqueued may still read or fill the pages. */
  (void)dspk__vk_submit(d);
  (void)dspk__vk_wait_value(d, d->submitted);
  VK(DestroyBuffer)(d->dev, m->buf, NULL);
  VK(FreeMemory)(d->dev, m->dm, NULL);
  free(m);
}

int dspk__vk_host_register(struct dspk__dev *d, void *ptr, size_t n) {
  struct dspk__mem *m;
  int r = import_ptr(d, ptr, n, &m);
  if (r)
    return r;
  m->hnext = d->hostregs;
  d->hostregs = m;
  return 0;
}

void dspk__vk_host_unregister(struct dspk__dev *d, void *ptr) {
  for (struct dspk__mem **pm = &d->hostregs; *pm; pm = &(*pm)->hnext)
    if ((*pm)->map == ptr) {
      struct dspk__mem *m = *pm;
      *pm = m->hnext;
      destroy_imported(d, m);
      return;
    }
}

/* The registered mapping holding [p, p + n), and p's offset in it. */
static struct dspk__mem *registered(struct dspk__dev *d, const void *p, size_t n,
                                    VkDeviceSize *off) {
  for (struct dspk__mem *m = d->hostregs; m; m = m->hnext) {
    const char *b = m->map;
    if ((const char *)p >= b && n <= m->size && (size_t)((const char *)p - b) <= m->size - n) {
      *off = (VkDeviceSize)((const char *)p - b);
      return m;
    }
  }
  return NULL;
}
