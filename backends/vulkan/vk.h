/*
 * Internal header of the Vulkan backend (backends/vulkan/).
 *
 * The Vulkan loader is opened with dlopen() at probe time, so a host without
 * it still runs the daemon (0 vulkan devices, with the reason).  Every Vulkan
 * entry point is called through one process-wide table, dspk__vk, filled from
 * vkGetInstanceProcAddr once the shared VkInstance exists; VK(Name) reads it.
 *
 * One struct dspk__dev per open device, owned by its runner thread: the
 * VkDevice, one compute queue, a command pool with a ring of command
 * buffers, and a timeline semaphore whose values are the device's fences
 * (value v is reached once the v-th submission finished).  Memory comes from
 * the shared caching pool (backends/common/pool.h) and goes back through the
 * shared retirement queue (backends/common/retire.h).  Compute pipelines are
 * made from GLSL compiled at run time with glslang (vk_shader.c); SPIR-V and
 * the VkPipelineCache data persist in the cache (cache/cache.h).
 *
 * Descriptors are pushed (VK_KHR_push_descriptor), so no descriptor pools are
 * needed: every pipeline has one set of storage buffers (binding i) and a
 * push-constant block of at most DSPK__VK_PC_MAX bytes.
 */
#ifndef DSPK_BACKENDS_VULKAN_VK_H
#define DSPK_BACKENDS_VULKAN_VK_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>

#include "backends/backend.h"
#include "backends/common/kcompile.h"
#include "backends/common/plancache.h"
#include "backends/common/pool.h"
#include "backends/common/retire.h"
#include "cache/cache.h"
#include "proto/testhook.h"

/* XX(name): instance- and device-level functions the backend calls. */
#define DSPK__VK_FUNCS(XX)                                                     \
  XX(DestroyInstance) XX(EnumeratePhysicalDevices)                             \
  XX(GetPhysicalDeviceProperties) XX(GetPhysicalDeviceProperties2)             \
  XX(GetPhysicalDeviceFeatures) XX(GetPhysicalDeviceFeatures2)                 \
  XX(GetPhysicalDeviceQueueFamilyProperties)                                   \
  XX(GetPhysicalDeviceMemoryProperties) XX(EnumerateDeviceExtensionProperties) \
  XX(CreateDevice) XX(DestroyDevice) XX(GetDeviceProcAddr) XX(GetDeviceQueue)  \
  XX(DeviceWaitIdle) XX(QueueSubmit) XX(QueueWaitIdle)                         \
  XX(CreateCommandPool) XX(DestroyCommandPool) XX(ResetCommandPool)            \
  XX(AllocateCommandBuffers) XX(FreeCommandBuffers) XX(BeginCommandBuffer)     \
  XX(EndCommandBuffer) XX(ResetCommandBuffer)                                  \
  XX(CreateSemaphore) XX(DestroySemaphore) XX(GetSemaphoreCounterValue)        \
  XX(WaitSemaphores) XX(CreateFence) XX(DestroyFence) XX(ResetFences)          \
  XX(WaitForFences) XX(GetFenceStatus)                                         \
  XX(CreateBuffer) XX(DestroyBuffer) XX(GetBufferMemoryRequirements)           \
  XX(AllocateMemory) XX(FreeMemory) XX(BindBufferMemory) XX(MapMemory)         \
  XX(UnmapMemory) XX(FlushMappedMemoryRanges)                                  \
  XX(InvalidateMappedMemoryRanges)                                             \
  XX(CmdCopyBuffer) XX(CmdFillBuffer) XX(CmdPipelineBarrier) XX(CmdDispatch)   \
  XX(CmdDispatchIndirect) XX(CmdBindPipeline) XX(CmdPushConstants)             \
  XX(CmdBindDescriptorSets)                                                    \
  XX(CreateShaderModule) XX(DestroyShaderModule) XX(CreateComputePipelines)    \
  XX(DestroyPipeline) XX(CreatePipelineLayout) XX(DestroyPipelineLayout)       \
  XX(CreateDescriptorSetLayout) XX(DestroyDescriptorSetLayout)                 \
  XX(CreateDescriptorPool) XX(DestroyDescriptorPool)                           \
  XX(AllocateDescriptorSets) XX(UpdateDescriptorSets)                          \
  XX(CreatePipelineCache) XX(DestroyPipelineCache) XX(GetPipelineCacheData)

struct dspk__vkfn {
  PFN_vkGetInstanceProcAddr GetInstanceProcAddr;
  PFN_vkCreateInstance CreateInstance;
  PFN_vkEnumerateInstanceVersion EnumerateInstanceVersion;
#define DSPK__VK_MEMBER(n) PFN_vk##n n;
  DSPK__VK_FUNCS(DSPK__VK_MEMBER)
#undef DSPK__VK_MEMBER
};

/* The process-wide function table (valid between probe and shutdown). */
extern struct dspk__vkfn dspk__vk;
#define VK(name) (dspk__vk.name)

/* The shared instance (vk_backend.c), NULL when probe found no Vulkan. */
extern VkInstance dspk__vk_instance;

#define DSPK__VK_PC_MAX 128   /* push-constant bytes of every pipeline */
#define DSPK__VK_MAX_BIND 16  /* storage buffers of one pipeline */
#define DSPK__VK_RING 64      /* command buffers in flight */
#define DSPK__VK_KERNELS 512  /* pipelines kept per device */
#define DSPK__VK_WG 256       /* workgroup size of the generated kernels */

/* A block of device memory: one VkBuffer over [off, off+size) of its
 * memory.  Large blocks own their VkDeviceMemory; small ones are slots of a
 * shared slab (see vk_mem.c). */
struct dspk__mem {
  VkBuffer buf;
  VkDeviceSize off, size;
  void *map;    /* host address of the block when its memory is mapped */
  int coherent; /* map needs no flush/invalidate */
  struct dspk__vk_slab *slab; /* NULL: dedicated memory */
  VkDeviceMemory dm;          /* dedicated memory */
  struct dspk__pool_block *pb; /* the pool's record of this block */
  int host;                    /* staging memory (host-visible pool) */
  VkDeviceSize bufsize;        /* size of the whole VkBuffer */
  /* The bytes asked of the pool (size is its bucket's, larger): a raw
   * kernel's stores past them are zeroed after it (vk_ops.c). */
  VkDeviceSize asked;
  int imported;                /* import_host: dm and buf over a client's pages */
  /* Given back by dspk__vk_free and not handed out since: a second free
   * (which backend.h forbids) is ignored rather than putting the block in
   * the pool's free list twice, where the next two blocks of its size
   * would be the same memory. */
  int freed;
  struct dspk__mem *hnext;     /* host_register: the device's next registered mapping */
};

/* One compiled kernel: pipeline and its layouts. */
struct dspk__vk_kernel {
  uint64_t key[2]; /* hash of GLSL/SPIR-V + bindings + push size */
  /* The persistent cache's key of its SPIR-V ("" when none: a client's
   * SPIR-V), so that uses served from the table count there. */
  char cache_id[DSPK__HASH_HEX];
  VkShaderModule mod;
  VkDescriptorSetLayout dsl;
  VkPipelineLayout layout;
  VkPipeline pipe;
  int nbind;
  uint32_t pcsize;
  uint64_t last_use;
};

/* A kernel remembered by its user (a plan, a tile), so that a launch need
 * not find it again by hashing its source: valid while the device's kernel
 * table still holds it, which dspk__vk_kmemo_get (vk_shader.c) checks by
 * key. */
struct dspk__vk_kmemo {
  struct dspk__vk_kernel *k;
  uint64_t key[2];
};

/* VK_KHR_cooperative_matrix, for Vulkan headers older than 1.3.255 (Debian
 * 12 has 1.3.239).  Values from the Vulkan registry (vk.xml). */
#ifndef VK_KHR_cooperative_matrix
#define VK_KHR_cooperative_matrix 1
#define VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME "VK_KHR_cooperative_matrix"
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR \
  ((VkStructureType)1000506000)
#define VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR ((VkStructureType)1000506001)
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR \
  ((VkStructureType)1000506002)
typedef enum VkComponentTypeKHR {
  VK_COMPONENT_TYPE_FLOAT16_KHR = 0,
  VK_COMPONENT_TYPE_FLOAT32_KHR = 1,
  VK_COMPONENT_TYPE_FLOAT64_KHR = 2,
  VK_COMPONENT_TYPE_MAX_ENUM_KHR = 0x7FFFFFFF
} VkComponentTypeKHR;
typedef enum VkScopeKHR {
  VK_SCOPE_DEVICE_KHR = 1,
  VK_SCOPE_WORKGROUP_KHR = 2,
  VK_SCOPE_SUBGROUP_KHR = 3,
  VK_SCOPE_QUEUE_FAMILY_KHR = 5,
  VK_SCOPE_MAX_ENUM_KHR = 0x7FFFFFFF
} VkScopeKHR;
typedef struct VkCooperativeMatrixPropertiesKHR {
  VkStructureType sType;
  void *pNext;
  uint32_t MSize, NSize, KSize;
  VkComponentTypeKHR AType, BType, CType, ResultType;
  VkBool32 saturatingAccumulation;
  VkScopeKHR scope;
} VkCooperativeMatrixPropertiesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
  VkStructureType sType;
  void *pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
} VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixPropertiesKHR {
  VkStructureType sType;
  void *pNext;
  VkShaderStageFlags cooperativeMatrixSupportedStages;
} VkPhysicalDeviceCooperativeMatrixPropertiesKHR;
typedef VkResult(VKAPI_PTR *PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(
    VkPhysicalDevice, uint32_t *, VkCooperativeMatrixPropertiesKHR *);
#endif

/* The cooperative-matrix gemm path of a device (vk_coopmat.c): which
 * extension it uses, the fragment shape (lm x ln x lk, f16 x f16 + f32) and
 * the kernels made so far.  Filled at open, before the VkDevice exists. */
enum dspk__vk_cm_kind {
  DSPK__VK_CM_NONE = 0, /* scalar kernel only */
  DSPK__VK_CM_NV,       /* VK_NV_cooperative_matrix */
  DSPK__VK_CM_KHR,      /* VK_KHR_cooperative_matrix (SPIR-V rewritten from NV) */
  DSPK__VK_CM_EMU       /* tests only: the same tiling, fragments in plain code */
};
#define DSPK__VK_CM_VARIANTS 64 /* kernel variants (DSPK__VK_CM_F_* flags) */
/* VK_KHR_shader_bfloat16, which the Debian 12 headers predate (values from
 * the Vulkan registry). */
#define DSPK__VK_BF16_EXT "VK_KHR_shader_bfloat16"
#define DSPK__VK_STYPE_BF16_FEATURES ((VkStructureType)1000141000)
#define DSPK__VK_COMPONENT_BF16 ((VkComponentTypeKHR)1000141000)
struct dspk__vk_bf16_features { /* VkPhysicalDeviceShaderBfloat16FeaturesKHR */
  VkStructureType sType;
  void *pNext;
  VkBool32 shaderBFloat16Type, shaderBFloat16DotProduct, shaderBFloat16CooperativeMatrix;
};
#define DSPK__VK_KCAPS 24 /* capabilities a raw kernel may declare, at most */
#define DSPK__VK_CM_TILES 11    /* workgroup tiles (vk_coopmat.c) */
struct dspk__vk_coopmat {
  enum dspk__vk_cm_kind kind;
  uint32_t lm, ln, lk; /* fragment shape */
  uint32_t sgsize;     /* subgroup size */
  uint32_t wm, wn, wtm, wtn, bk, nbuf; /* a forced tile (DSPK_VK_COOPMAT_TILE), or 0 */
  char why[160];       /* why the path is off, or what it is */
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR fkhr; /* chained at CreateDevice */
  VkPhysicalDeviceCooperativeMatrixFeaturesNV fnv;
  int bf16; /* KHR path: bf16 too (VK_KHR_shader_bfloat16), fragments blm x bln x blk */
  uint32_t blm, bln, blk;
  char bf16_why[96]; /* else why not (describe) */
  struct dspk__vk_bf16_features fbf16;
  struct dspk__vk_kmemo kern[DSPK__VK_CM_TILES][DSPK__VK_CM_VARIANTS];
  uint64_t ngemm; /* gemms recorded on this path */
};

/* How long a wait for the timeline polls before it blocks, on a GPU
 * (dspk__vk_wait_value). */
#define DSPK__VK_SPIN_NS 1000000u

struct dspk__vk_cmd {
  VkCommandBuffer cb;
  uint64_t value; /* timeline value its submission signals; 0: never used */
};

struct dspk__dev {
  struct dspk__devenv env;
  struct dspk__kcompile_spare kspare; /* clients' compiles (kcompile.h) */
  /* A software device's trials of clients' pipelines (vk_shader.c). */
  struct dspk__kcompile_spare pspare;
  int index;
  VkPhysicalDevice pd;
  VkPhysicalDeviceProperties props;
  VkPhysicalDeviceMemoryProperties memprops;
  VkDevice dev;
  VkQueue queue;
  uint32_t qfamily;
  VkCommandPool cpool;
  VkSemaphore timeline;
  uint64_t submitted; /* last value signalled by a submission */
  uint64_t spin_ns;   /* dspk__vk_wait_value polls this long before it blocks */
  struct dspk__vk_cmd ring[DSPK__VK_RING];
  unsigned ring_next;
  VkCommandBuffer rec; /* the command buffer being recorded, or NULL */
  struct dspk__vk_cmd *rec_slot;
  PFN_vkCmdPushDescriptorSetKHR CmdPushDescriptorSetKHR;
  /* VK_EXT_external_memory_host (import_host), when offered: */
  PFN_vkGetMemoryHostPointerPropertiesEXT GetMemoryHostPointerPropertiesEXT;
  VkDeviceSize host_import_align; /* minImportedHostPointerAlignment; 0: none */
  struct dspk__mem *hostregs;     /* host_register: client mappings imported for DMA */
  int has_f64, has_int64, has_coopmat, has_f16;
  /* shaderZeroInitializeWorkgroupMemory is on: raw kernels may use
   * workgroup memory (vk_spvzero.c). */
  int zero_wg;
  /* Raw kernels' storage-buffer accesses are bounded to the descriptors'
   * ranges (robustBufferAccess2's behaviour: loads past a tensor read zero,
   * stores are dropped): 1 per pipeline (VK_EXT_pipeline_robustness), 2 for
   * every pipeline of the device (robustBufferAccess2 enabled), 0 not at
   * all (protocol.md, kernel). */
  int robust_raw;
  /* The SPIR-V capabilities a raw kernel may declare: those the device has
   * enabled (dspk__vk_spv_caps), DSPK__VK_KCAPS at most. */
  uint32_t kcaps[DSPK__VK_KCAPS];
  int nkcaps;
  uint32_t devtype_local, devtype_host; /* memory type indices */
  int local_is_host;  /* device memory is host-visible (lavapipe, UMA) */
  int local_cached;   /* ... and host-cached: the host may read it directly */
  VkDeviceSize align; /* minStorageBufferOffsetAlignment */
  /* memory */
  struct dspk__pool pool, hpool; /* device-local, staging */
  struct dspk__vk_slab *slabs;
  struct dspk__retire retire;
  /* kernels */
  struct dspk__vk_kernel *kernels;
  int nkernels;
  uint64_t kclock;
  VkPipelineCache pcache;
  char pcache_name[128];
  size_t pcache_loaded; /* bytes loaded from the cache at open */
  uint64_t nkernels_made_since_open; /* pipelines created (save data when > 0) */
  struct dspk__plancache plans; /* contract and fft plans */
  VkFence fft_fence;            /* VkFFT's own submissions at plan creation */
  /* cache identity */
  char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE], uuid[40], driver[64], arch[32];
  uint64_t kernels_compiled, kernel_cache_hits;
  struct dspk__vk_coopmat cm; /* cooperative-matrix gemm (vk_coopmat.c) */
  struct dspk__vk_kmemo fir_fix[DSPK_DTYPE_COUNT]; /* dspk__vk_fir_fixup's kernels */
};

/* ---- vk_backend.c ------------------------------------------------------- */

/* Maps a VkResult to a dspk_errno (DSPK_ENOMEM for out-of-memory results,
 * DSPK_EDEVICE otherwise; 0 for VK_SUCCESS). */
int dspk__vk_err(VkResult r);
/* Formats into ctx->errmsg (when there is a ctx) and returns code. */
#define dspk__vk_fail dspk__op_fail

/* Returns the command buffer being recorded, beginning one when none is
 * (a ring slot whose previous submission finished; waits for it when the
 * ring is full).  The first command of a fresh buffer is a full memory
 * barrier, so work is ordered after every earlier submission. */
int dspk__vk_cmd(struct dspk__dev *d, VkCommandBuffer *out);
/* Inserts a compute/transfer memory barrier into the open command buffer. */
void dspk__vk_barrier(struct dspk__dev *d);
/* Ends and submits the open command buffer (no-op when none), signalling
 * the next timeline value.  Returns 0 or a negative dspk_errno. */
int dspk__vk_submit(struct dspk__dev *d);
/* Waits until timeline value v is reached.  Returns 0 or an error. */
int dspk__vk_wait_value(struct dspk__dev *d, uint64_t v);
/* The end of one piece of a long op (small gemm, fir's direct sum):
 * submits what is recorded, waits until the piece before it ran (so at
 * most two are queued) and counts it in *npieces; DSPK_ECANCELED once the
 * task is canceled (a cancel is seen within about two pieces' time on any
 * driver).  cancel_after: a test hook's value (a cancel that comes after
 * that many pieces), or NULL.  0 or a negative dspk_errno. */
int dspk__vk_piece_end(struct dspk__dev *d, struct dspk__opctx *ctx, const char *cancel_after,
                       int *npieces);

/* ---- vk_mem.c ----------------------------------------------------------- */

int dspk__vk_mem_init(struct dspk__dev *d);
void dspk__vk_mem_fini(struct dspk__dev *d);
int dspk__vk_alloc(struct dspk__dev *d, size_t n, struct dspk__mem **out);
void dspk__vk_free(struct dspk__dev *d, struct dspk__mem *m);
/* import_host of the backend table (VK_EXT_external_memory_host): a block
 * over the client's pages; DSPK_ENOTSUP where the device lacks it or ptr/n
 * do not meet its alignment.  Its free waits for the queue and releases at
 * once (the daemon unmaps right after). */
int dspk__vk_import_host(struct dspk__dev *d, void *ptr, size_t n, struct dspk__mem **out);
int dspk__vk_host_register(struct dspk__dev *d, void *ptr, size_t n);
void dspk__vk_host_unregister(struct dspk__dev *d, void *ptr);
/* A host-visible staging block of at least n bytes (freed like any block). */
int dspk__vk_alloc_host(struct dspk__dev *d, size_t n, struct dspk__mem **out);
int dspk__vk_write(struct dspk__dev *d, struct dspk__mem *m, size_t off,
                   const void *src, size_t n);
int dspk__vk_read(struct dspk__dev *d, struct dspk__mem *m, size_t off,
                  void *dst, size_t n);
/* Sets bytes [off, off + n) of m to zero (both multiples of 4), ordered
 * after the work submitted before and before the work after (submitted at
 * once).  0, DSPK_ERANGE, or a device error. */
int dspk__vk_zero(struct dspk__dev *d, struct dspk__mem *m, size_t off, size_t n);

/* ---- vk_shader.c -------------------------------------------------------- */

/* A kernel source built in a fixed buffer p of len bytes, printf-like
 * piece by piece (dspk__vk_ap): at bytes so far, over once a piece did not
 * fit (the text is then cut and must not be used). */
struct dspk__vk_sbuf {
  char *p;
  size_t len, at;
  int over;
};
void dspk__vk_ap(struct dspk__vk_sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Compiles GLSL compute source to SPIR-V (malloc'd words, *nwords).  On a
 * compile error returns DSPK_ECOMPILE with glslang's log in log.  Goes
 * through the persistent cache first (counted in the device's stats);
 * cache_id (may be NULL) gets the entry's key (dspk__cache_kernel_id). */
/* client: NULL for the daemon's own kernels; a client's task for its raw
 * kernel, which is cached for client->owner alone and compiled under the
 * limits of backends/common/kcompile.h (DSPK_ELIMIT past them) when the
 * device's env has a compile_exe. */
int dspk__vk_glsl_to_spirv(struct dspk__dev *d, const char *name,
                           const char *src, const struct dspk__opctx *client,
                           uint32_t **spv, size_t *nwords,
                           char *log, size_t loglen, char cache_id[DSPK__HASH_HEX]);
/* Returns the kernel for GLSL src (or, when spirv is non-NULL, for that
 * SPIR-V binary of nbytes) with nbind storage-buffer bindings and pcsize
 * push-constant bytes: from the device's table, else compiled.  The device
 * owns it.  entry is the SPIR-V entry point ("main").  A client's kernel
 * (name "raw") on a software device whose env has a compile_exe is first
 * made into a pipeline by that child (vk_shader.c): DSPK_ELIMIT past its
 * limits, DSPK_ECOMPILE when the driver crashed there. */
int dspk__vk_kernel(struct dspk__dev *d, const char *name, const char *src,
                    const void *spirv, size_t nbytes, const char *entry,
                    int nbind, uint32_t pcsize, struct dspk__vk_kernel **out,
                    struct dspk__opctx *ctx);
void dspk__vk_kernels_fini(struct dspk__dev *d);
/* The backend's table (vk_backend.c). */
extern const struct dspk__backend dspk__backend_vulkan;
/* The child's side of a raw kernel's pipeline tried first on a software
 * device (vk_shader.c): `EXE --kernel-compile vkpipe:SPEC`, SPEC being
 * INDEX:UUID of the daemon's device.  Returns the exit status. */
int dspk__vk_trial_main(const char *spec);
/* Checks the resources valid SPIR-V module w (nw words) uses at entry point
 * entry against a layout of nbind storage buffers (bindings 0 .. nbind-1 of
 * set 0) and pcsize push-constant bytes, and its work-group size and shared
 * (Workgroup) bytes against the device's limits lim (none when NULL)
 * (vk_spvcheck.c): 0 when they fit, DSPK_EINVAL with msg naming the
 * resource when the shader uses one the layout lacks, DSPK_ELIMIT beyond a
 * limit, DSPK_ECOMPILE when the module has no GLCompute entry point entry,
 * DSPK_ENOMEM.  dspk__vk_kernel applies it to a client's kernel (name
 * "raw"), after dspk__vk_spv_validate, before making its pipeline. */
int dspk__vk_spv_check(const uint32_t *w, size_t nw, const char *entry, int nbind,
                       uint32_t pcsize, const VkPhysicalDeviceLimits *lim, char *msg,
                       size_t msglen);
/* Checks that every OpCapability of module w (nw words) is one of the nok
 * capabilities in ok (the device's kcaps: a capability whose feature the
 * device has not enabled is undefined in Vulkan, and PhysicalStorageBuffer
 * addresses would let a kernel reach any memory of the device): 0, or
 * DSPK_ENOTSUP with msg naming the first one that is not. */
int dspk__vk_spv_caps(const uint32_t *w, size_t nw, const uint32_t *ok, int nok, char *msg,
                      size_t msglen);
/* Validates SPIR-V module w (nw words) with SPIRV-Tools' validator for a
 * device of Vulkan apiVersion api (vk_spvval.c): 0 when valid,
 * DSPK_ECOMPILE with msg quoting the validator (sanitized) when not,
 * DSPK_ENOMEM.  dspk__vk_kernel applies it to every client's kernel (name
 * "raw") before anything else reads the module. */
int dspk__vk_spv_validate(uint32_t api, const uint32_t *w, size_t nw, char *msg,
                          size_t msglen);
/* A client's module validated as above, its indices clamped
 * (dspk__vk_spv_robust) and the result validated again, in a child, `EXE
 * --kernel-compile spvval:API` under the limits of kcompile.h (in this
 * process when d has no executable for children), its id bound checked
 * first (ELIMIT past 65536 + 4 per word); *cancel stops it.  0 with the
 * clamped module in *out (malloc'd, *nout words), or the error with msg. */
int dspk__vk_spv_validate_client(struct dspk__dev *d, const uint32_t *w, size_t nw,
                                 atomic_int *cancel, uint32_t **out, size_t *nout, char *msg,
                                 size_t msglen);
/* Valid module w (nw words, for Vulkan 1.3 when vulkan13, else 1.2) with
 * every access-chain index clamped into its array, vector or matrix
 * (SPIRV-Tools' graphics-robust-access pass), but those into storage and
 * uniform buffers, which Vulkan's robustness bounds (vk_spvrobust.c): 0
 * with *out (malloc'd, *nout words), DSPK_EINVAL with msg when the module
 * cannot be bounded so, DSPK_ENOMEM. */
int dspk__vk_spv_robust(int vulkan13, const uint32_t *w, size_t nw, uint32_t **out,
                        size_t *nout, char *msg, size_t msglen);
/* The child's side (backends/registry.c): validates what it reads for
 * Vulkan apiVersion api (decimal). */
int dspk__vk_spvval_main(const char *api);
/* The zero-initialising rewrite of a client's SPIR-V module w (nw words,
 * vk_spvzero.c): every Workgroup, Private and Function variable without an
 * initializer gets OpConstantNull, every OpUndef becomes an OpConstantNull,
 * so that no shader reads bytes an earlier task (another user's) left in
 * workgroup memory or registers.  workgroup: the device zero-initialises
 * workgroup memory (shaderZeroInitializeWorkgroupMemory); without it a
 * module declaring Workgroup variables is DSPK_ENOTSUP.  *out malloc'd,
 * *nout words; 0, DSPK_EINVAL (malformed), DSPK_ENOTSUP, DSPK_ELIMIT (no id
 * left), DSPK_ENOMEM; msg says why for the errors but ENOMEM. */
int dspk__vk_spv_zero_init(const uint32_t *w, size_t nw, int workgroup, uint32_t **out,
                           size_t *nout, char *msg, size_t msglen);
/* A copy of module w (nw words) with an OpSourceExtension holding text (a
 * debug instruction: the code is unchanged) before its first debug
 * instruction: 0 with *out (malloc'd) and *outnw, or DSPK_ENOMEM.  A module
 * that cannot be read is copied as it is (the driver's to refuse). */
int dspk__vk_spv_mark(const uint32_t *w, size_t nw, const char *text, uint32_t **out,
                      size_t *outnw);
/* Loads / saves the VkPipelineCache data through the persistent cache. */
int dspk__vk_pcache_init(struct dspk__dev *d);
void dspk__vk_pcache_fini(struct dspk__dev *d);
/* The glslang version string used in cache keys. */
const char *dspk__vk_glslang_version(void);
/* The device's identity in cache keys (kernels, autotune decisions); the
 * strings belong to d. */
struct dspk__cache_devid dspk__vk_devid(const struct dspk__dev *d);
/* Whether physical device pd offers the device extension name. */
int dspk__vk_has_ext(VkPhysicalDevice pd, const char *name);

/* A storage-buffer binding: buffer range [off, off+range). */
struct dspk__vk_bind {
  VkBuffer buf;
  VkDeviceSize off, range;
};

/* A binding of an op's temporary m from the pool: the bytes asked for
 * (up to a multiple of 4, at least 4), not the block's size, which the
 * pool rounds up to its bucket and which may pass maxStorageBufferRange
 * where the bytes asked do not. */
static inline struct dspk__vk_bind dspk__vk_bind_temp(const struct dspk__mem *m) {
  VkDeviceSize n = (m->asked + 3) & ~(VkDeviceSize)3, cap = m->size < 4 ? 4 : m->size;
  if (n < 4)
    n = 4;
  return (struct dspk__vk_bind){m->buf, m->off, n < cap ? n : cap};
}

/* The largest tensor, in bytes, that a device of limits l binds whatever
 * its offset (the devices answer's max_tensor_bytes): a binding starts at
 * the tensor's offset aligned down to minStorageBufferOffsetAlignment (at
 * least 4), up to that less one byte before it, and ends at a multiple of
 * 4, so maxStorageBufferRange down to a multiple of 4, less one less than
 * the alignment: range - (alignment - 1). */
uint64_t dspk__vk_max_tensor_bytes(const VkPhysicalDeviceLimits *l);
/* Binds a tensor: the buffer range starting at an offset aligned down to
 * the device's storage-buffer alignment; *elem gets the tensor's first
 * element index within that range.  DSPK_ENOTSUP when the tensor's offset
 * is not a multiple of its element size, or when it has more bytes than
 * dspk__vk_max_tensor_bytes: what the device cannot do (protocol.md). */
int dspk__vk_bind_tensor(struct dspk__dev *d, const struct dspk__tensor *t,
                         struct dspk__vk_bind *b, uint32_t *elem);
/* dspk__vk_bind_tensor, or the task's ENOTSUP with a message that names
 * the tensor (what: its name in protocol.md, "gemm's B", "map's A",
 * "kernel's argument 0 (input 0)"), which of the two it is, and
 * the sizes: its bytes and the limit, or its offset and element size. */
int dspk__vk_bind_named(struct dspk__dev *d, const struct dspk__tensor *t,
                        struct dspk__vk_bind *b, uint32_t *elem, struct dspk__opctx *ctx,
                        const char *what);
/* maxComputeWorkGroupCount[axis]: the most workgroups one dispatch may
 * have on that axis.  Ops whose work would need more split it over several
 * dispatches (or a 2-D grid).  A test build lowers it to the value of
 * DSPK_VK_MAX_GROUPS, so that tests reach those splits at small sizes. */
static inline uint32_t dspk__vk_max_groups(const struct dspk__dev *d, int axis) {
  uint32_t m = d->props.limits.maxComputeWorkGroupCount[axis];
  const char *h = DSPK_TEST_HOOK("DSPK_VK_MAX_GROUPS");
  if (h && strtoul(h, NULL, 10) > 0 && strtoul(h, NULL, 10) < m)
    m = (uint32_t)strtoul(h, NULL, 10);
  return m;
}

/* Records a dispatch of k with the given bindings and push constants into
 * the open command buffer (opening one), followed by a barrier. */
int dspk__vk_dispatch(struct dspk__dev *d, struct dspk__vk_kernel *k,
                      const struct dspk__vk_bind *b, int nb, const void *pc,
                      uint32_t pcsize, uint32_t gx, uint32_t gy, uint32_t gz);

/* A 2-D grid of at least ngroups workgroups within the dispatch limits:
 * *gx along x, *gy rows.  DSPK_ELIMIT through ctx ("OP: COUNT NOUN exceed
 * the dispatch limits") when even that does not fit. */
int dspk__vk_grid2d(struct dspk__dev *d, uint64_t ngroups, uint32_t *gx, uint32_t *gy,
                    const char *op, uint64_t count, const char *noun,
                    struct dspk__opctx *ctx);
/* Sets a sliced dispatch's push constants pc for the slice [r0, r0 + rn)
 * of n summed elements. */
typedef void dspk__vk_slice_fn(void *pc, uint64_t r0, uint64_t rn, uint64_t n);
/* Dispatches k over the gx x gy grid once per slice of at most slice of
 * the n summed elements (once when n is 0), set() filling pc before each:
 * every invocation then loops a bounded number of times whatever n is
 * (lavapipe silently stops a shader invocation's loops after 65535
 * iterations in all). */
/* dspk__vk_dispatch with the group counts read by the device from
 * args (three words) when it runs: none when x is 0. */
int dspk__vk_dispatch_indirect(struct dspk__dev *d, struct dspk__vk_kernel *k,
                               const struct dspk__vk_bind *b, int nb, const void *pc,
                               uint32_t pcsize, const struct dspk__vk_bind *args);
int dspk__vk_dispatch_sliced(struct dspk__dev *d, struct dspk__vk_kernel *k,
                             const struct dspk__vk_bind *b, int nb, void *pc, uint32_t pcsize,
                             uint32_t gx, uint32_t gy, uint64_t n, uint64_t slice,
                             dspk__vk_slice_fn *set);

/* ---- vk_fft.c ----------------------------------------------------------- */

/* How many of the fft tuner's runs on the calling thread were timed by
 * the device's timestamps (tests). */
unsigned dspk__vk_fft_timed(void);
/* Whether d's queue writes timestamps. */
int dspk__vk_timestamps(struct dspk__dev *d);
/* GPU time, by timestamps around them, of reps recordings made by rec(ud,
 * i) into the open command buffer, in ms per recording; waits for the
 * device.  DSPK_ENOTSUP when the queue has no timestamps.  For benchmarks,
 * profiles and the fir tuner's samples. */
int dspk__vk_gpu_ms(struct dspk__dev *d, int reps, int (*rec)(void *ud, int i), void *ud,
                    double *ms);

/* m's kernel (marked used), or NULL when it was never set or was evicted. */
struct dspk__vk_kernel *dspk__vk_kmemo_get(struct dspk__dev *d, struct dspk__vk_kmemo *m);
void dspk__vk_kmemo_set(struct dspk__vk_kmemo *m, struct dspk__vk_kernel *k);

/* ---- vk_coopmat.c ------------------------------------------------------- */

/* At open, before vkCreateDevice: decides the cooperative-matrix path of d
 * (DSPK_VK_COOPMAT=auto|khr|nv|off|emulate; auto prefers KHR) from the
 * device's extensions, features and (f16, f16, f32, f32, subgroup) shapes,
 * fills d->cm, and when a path is taken appends its extension name to
 * exts[*next] (room for one more is needed) and links its feature struct
 * (owned by d) in front of *pnext.  base_ok: the device has shaderFloat16,
 * storageBuffer16BitAccess and vulkanMemoryModel, and enables them. */
void dspk__vk_coopmat_setup(struct dspk__dev *d, int base_ok, const char **exts,
                            uint32_t *next, void **pnext);
/* The name of hardware tile candidate i ("2x4x64x32x32x1": subgroups wm x
 * wn, each wtm x wtn of C, depth bk, shared buffers; the
 * DSPK_VK_COOPMAT_TILE syntax), or NULL past the last. */
const char *dspk__vk_coopmat_tile_name(int i);
/* The default workgroup tile of cm's kernel: rows bm, columns bn, depth
 * bk (large gemms may take another, chosen by the autotuner). */
void dspk__vk_coopmat_tile(const struct dspk__vk_coopmat *cm, uint32_t *bm, uint32_t *bn,
                           uint32_t *bk);
/* 1 when op (a gemm) goes through the cooperative-matrix path on d: the
 * path is on, A and B are f16, and every batch axis is whole or broadcast. */
int dspk__vk_coopmat_usable(struct dspk__dev *d, const struct dspk__op *op);
/* Records op (a gemm that dspk__vk_coopmat_usable() accepted).  Returns 0 or
 * a negative dspk_errno with detail in ctx. */
int dspk__vk_coopmat_gemm(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
/* Writes a one-line description of d's f16 gemm path into buf ("coopmat khr
 * 16x8x16, ..." or "scalar: <why>") and returns d->cm.kind. */
int dspk__vk_coopmat_describe(struct dspk__dev *d, char *buf, size_t len);
/* The GLSL (GL_NV_cooperative_matrix) of the kernel with tile number `tile`
 * (0: the default) and variant `flags` (DSPK__VK_CM_F_*) for cm's shape,
 * written into buf.  Returns the length
 * snprintf reports (>= len: too small). */
#define DSPK__VK_CM_F_AVEC 1u /* A read as uvec4 (k contiguous, aligned) */
#define DSPK__VK_CM_F_BVEC 2u /* B read as uvec4 (n contiguous, aligned) */
#define DSPK__VK_CM_F_AKC 4u  /* A's k axis contiguous (scalar reads) */
#define DSPK__VK_CM_F_BNC 8u  /* B's n axis contiguous (scalar reads) */
#define DSPK__VK_CM_F_HASC 16u /* beta * C term */
#define DSPK__VK_CM_F_BF16 32u /* A and B bf16 (KHR path, SPIR-V rewritten) */
int dspk__vk_coopmat_source(char *buf, size_t len, const struct dspk__vk_coopmat *cm,
                            int tile, unsigned flags);
/* Tests: while on, building a cooperative-matrix kernel fails with
 * DSPK_ECOMPILE (as when a driver rejects it): the path turns itself off on
 * that device and the gemm runs on the scalar kernel. */
#ifdef DSPK_TEST_HOOKS
void dspk__vk_coopmat_fault(int on);
/* Tests: gemms of at least n multiply-adds are tuned (0: the default). */
void dspk__vk_coopmat_tune_min(uint64_t n);
#endif
/* Rewrites a SPIR-V module from SPV_NV_cooperative_matrix to
 * SPV_KHR_cooperative_matrix (types gain a Use inferred from MulAdd
 * operands; loads/stores take a MemoryLayout constant).  *out is malloc'd
 * (caller frees), *nout words.  Returns 0, DSPK_EINVAL for a malformed
 * module, DSPK_ENOTSUP for one it cannot rewrite (a type used as two of A,
 * B and C; a non-constant ColumnMajor), DSPK_ENOMEM. */
int dspk__vk_coopmat_nv_to_khr(const uint32_t *in, size_t n, uint32_t **out, size_t *nout);
/* Rewrites a module's 16-bit floats to bfloat16 (SPV_KHR_bfloat16: each
 * OpTypeFloat 16 gains the BFloat16KHR encoding; the BFloat16TypeKHR and
 * BFloat16CooperativeMatrixKHR capabilities and the extension are added).
 * For the kernel, whose 16-bit values are only moved (loaded, stored,
 * zero-filled) and multiplied as cooperative matrices, that makes the f16
 * kernel a bf16 one.  *out malloc'd, *nout words; 0, DSPK_EINVAL (malformed,
 * or no 16-bit float), DSPK_ENOMEM. */
int dspk__vk_coopmat_bf16(const uint32_t *in, size_t n, uint32_t **out, size_t *nout);

/* ---- vk_ops.c, vk_gemm.c, vk_fft.c -------------------------------------- */

int dspk__vk_run(struct dspk__dev *d, struct dspk__op *op,
                 struct dspk__opctx *ctx);
int dspk__vk_map(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
int dspk__vk_reduce(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
int dspk__vk_fir(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
int dspk__vk_fir_direct(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
/* The direct kernel on the overlap-save segments that fl lists (vk_ops.c
 * says how), overwriting their outputs: vk_fir.c's repair of non-finite
 * segments. */
int dspk__vk_fir_fixup(struct dspk__dev *d, struct dspk__op *op, const struct dspk__vk_bind *fl,
                       uint32_t S, uint32_t nb, uint32_t nblk, struct dspk__opctx *ctx);
/* The list fl of non-finite overlap-save segments, in 32-bit words: [0, 3)
 * the repair's indirect dispatch (x: min(listed * chunks, the cap below), 1,
 * 1), [3] how many are listed, [DSPK__VK_FL_HEAD, +nblk) a flag per
 * segment, then the list.  The GLSL that clears it (all but [1] and [2]
 * zero) and the GLSL that lists segment g (its arguments: the words fl, the
 * segment, nblk, S and the cap), for the kernels that write the outputs
 * (vk_fir.c, vk_sfft.c). */
#define DSPK__VK_FL_HEAD 4u
#define DSPK__VK_FL_WORDS(nblk) (DSPK__VK_FL_HEAD + 2u * (uint32_t)(nblk))
extern const char dspk__vk_fl_glsl[];
/* The cap on the repair's workgroups for segments of S outputs, nblk in
 * all (the fl list's push constant `cap`). */
uint32_t dspk__vk_fir_fix_groups(const struct dspk__dev *d, uint32_t S, uint32_t nblk);
/* fir's path, for tests and benchmarks (vk_fir.c, process-wide): force one
 * (-1: the tuned choice; 0: direct; 1..3: overlap-save with blocks of
 * 2^(m+1) times the filter's length rounded up to a power of two,
 * "ols-x4".."ols-x16"), tune even on software devices (lavapipe) when
 * `always` is set, and the name of the path the calling thread's last fir
 * took. */
#ifdef DSPK_TEST_HOOKS
void dspk__vk_fir_force(int mode); /* test hooks: test builds only */
void dspk__vk_fir_tune_always(int always);
/* The first four words of the list of non-finite segments
 * (DSPK__VK_FL_HEAD) of the calling thread's last overlap-save fir, once
 * it completed: DSPK_ENOENT when its workspace is gone. */
int dspk__vk_fir_list_head(struct dspk__dev *d, uint32_t head[4]);
#endif
/* Frees fir's workspace (a plan of kind 5, see plan_evict), through the
 * retirement queue. */
void dspk__vk_fir_ws_free(struct dspk__dev *d, void *ws);
const char *dspk__vk_fir_last(void);
/* Whether the last FFT path ran fused into our fft kernels (tests). */
int dspk__vk_fir_last_fused(void);
/* How many of the fir tuner's runs on the calling thread were timed by the
 * device's timestamps (tests). */
unsigned dspk__vk_fir_timed(void);
/* How many repairs of non-finite segments (dspk__vk_fir_fixup) the
 * calling thread's fir tasks recorded (tests: none in the tuner's samples). */
unsigned dspk__vk_fir_repairs(void);
int dspk__vk_kernel_op(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
int dspk__vk_gemm(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
int dspk__vk_contract(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
int dspk__vk_fft(struct dspk__dev *d, struct dspk__op *op, struct dspk__opctx *ctx);
/* 1 when this build has the fft op (VkFFT was found: vk_fft.c), 0 without
 * (vk_fft_none.c). */
extern const int dspk__vk_fft_built;
/* gemm kernel candidates, for tests and benchmarks (vk_gemm.c): their
 * count and names, forcing one (i < 0: the autotuner chooses again), and
 * the name of the one the calling thread's last gemm launched. */
int dspk__vk_gemm_ncands(void);
const char *dspk__vk_gemm_cand_name(int i);
#ifdef DSPK_TEST_HOOKS
void dspk__vk_gemm_force(int i); /* a test hook: test builds only */
#endif
const char *dspk__vk_gemm_last(void);
/* Frees an FFT plan (the plan cache's evict callback uses it). */
void dspk__vk_fft_plan_free(struct dspk__dev *d, void *plan);

/* The GLSL type of a dtype's elements ("float", "dvec2", ...). */
const char *dspk__vk_glsl_type(dspk_dtype dt);

#endif /* DSPK_BACKENDS_VULKAN_VK_H */
