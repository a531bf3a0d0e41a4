/*
 * Shaders and pipelines of the Vulkan backend.
 *
 * GLSL (generated per op, or a client's raw kernel) is compiled to SPIR-V
 * with glslang's C interface.  Before compiling, the SPIR-V is looked up in
 * the persistent cache (cache/cache.h) under the kernel key of DESIGN.md:
 * the generated source, the compile options, "glslang" and its version, and
 * the device's identity and driver, so a restarted daemon compiles nothing
 * it compiled before (kernels_compiled / kernel_cache_hits count both ways).
 * Pipelines are then made through a VkPipelineCache whose data is loaded
 * from the cache at open and saved back at close, keyed by the device's
 * pipelineCacheUUID and driver version.
 *
 * Each device keeps its pipelines in a small table keyed by a hash of the
 * code and layout; every pipeline has one push-descriptor set of storage
 * buffers and one push-constant range.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <glslang/Include/glslang_c_interface.h>
#include <glslang/Public/resource_limits_c.h>
#include <glslang/build_info.h>

#include "backends/common/kcompile.h"
#include "backends/common/srccheck.h"
#include "proto/utf8.h"
#include "backends/vulkan/vk.h"
#include "cache/cache.h"
#include "proto/testhook.h"

#define STR2(x) #x
#define STR(x) STR2(x)
static const char glslang_version[] = STR(GLSLANG_VERSION_MAJOR) "." STR(
    GLSLANG_VERSION_MINOR) "." STR(GLSLANG_VERSION_PATCH);
static const char compile_options[] = "vulkan1.2 spv1.5 glsl450";

const char *dspk__vk_glslang_version(void) { return glslang_version; }

struct dspk__cache_devid dspk__vk_devid(const struct dspk__dev *d) {
  return (struct dspk__cache_devid){.backend = "vulkan", .name = d->name, .arch = d->arch,
                                    .uuid = d->uuid, .driver = d->driver};
}

static void key_of(struct dspk__dev *d, const char *name, const char *owner, const char *src,
                   struct dspk__kernel_key *k) {
  memset(k, 0, sizeof *k);
  k->dev = dspk__vk_devid(d);
  k->compiler = "glslang";
  k->compiler_version = glslang_version;
  k->name = name;
  k->source = src;
  k->source_len = strlen(src);
  k->options = compile_options;
  k->owner = owner;
}

/* glslang's includer, for GL_GOOGLE_include_directive and
 * GL_ARB_shading_language_include: without callbacks the C interface reads
 * files relative to the working directory.  dspk__src_check refuses every
 * include before glslang runs; where glslang's C interface takes include
 * callbacks (newer than glslang 12), these refuse every name as a second
 * wall (an empty header_name is glslang's "failed"; header_data its
 * message), the same way whether or not the file exists. */
#ifdef DSPK_GLSLANG_HAS_CALLBACKS
static glsl_include_result_t refused = {
    .header_name = "",
    .header_data = "raw kernels cannot read files: #include is refused",
    .header_length = sizeof "raw kernels cannot read files: #include is refused" - 1,
};

static glsl_include_result_t *include_refuse(void *ctx, const char *header, const char *includer,
                                             size_t depth) {
  (void)ctx, (void)header, (void)includer, (void)depth;
  return &refused;
}

static int include_free(void *ctx, glsl_include_result_t *r) {
  (void)ctx, (void)r; /* static */
  return 0;
}
#endif

static int compile(const char *src, uint32_t **spv, size_t *nwords, char *log,
                   size_t loglen) {
  glslang_input_t in = {
      .language = GLSLANG_SOURCE_GLSL,
      .stage = GLSLANG_STAGE_COMPUTE,
      .client = GLSLANG_CLIENT_VULKAN,
      .client_version = GLSLANG_TARGET_VULKAN_1_2,
      .target_language = GLSLANG_TARGET_SPV,
      .target_language_version = GLSLANG_TARGET_SPV_1_5,
      .code = src,
      .default_version = 450,
      .default_profile = GLSLANG_NO_PROFILE,
      .force_default_version_and_profile = 0,
      .forward_compatible = 0,
      .messages = GLSLANG_MSG_DEFAULT_BIT,
      .resource = glslang_default_resource(),
#ifdef DSPK_GLSLANG_HAS_CALLBACKS
      .callbacks = {.include_system = include_refuse,
                    .include_local = include_refuse,
                    .free_include_result = include_free},
#endif
  };
  int r = DSPK_ECOMPILE;
  glslang_program_t *prog = NULL;
  glslang_shader_t *sh;
  if (dspk__src_check(src, strlen(src), DSPK__SRC_GLSL, "kernel.comp", log, loglen))
    return DSPK_ECOMPILE;
  sh = glslang_shader_create(&in);
  if (!sh)
    return DSPK_ENOMEM;
  if (!glslang_shader_preprocess(sh, &in) || !glslang_shader_parse(sh, &in)) {
    dspk__format(log, loglen, "glsl: %s", glslang_shader_get_info_log(sh));
    goto out;
  }
  prog = glslang_program_create();
  if (!prog) {
    r = DSPK_ENOMEM;
    goto out;
  }
  glslang_program_add_shader(prog, sh);
  if (!glslang_program_link(prog, GLSLANG_MSG_SPV_RULES_BIT | GLSLANG_MSG_VULKAN_RULES_BIT)) {
    dspk__format(log, loglen, "glsl: %s", glslang_program_get_info_log(prog));
    goto out;
  }
  glslang_program_SPIRV_generate(prog, GLSLANG_STAGE_COMPUTE);
  size_t n = glslang_program_SPIRV_get_size(prog);
  uint32_t *w = malloc(n * sizeof *w);
  if (!w) {
    r = DSPK_ENOMEM;
    goto out;
  }
  glslang_program_SPIRV_get(prog, w);
  *spv = w;
  *nwords = n;
  r = 0;
out:
  glslang_program_delete(prog);
  glslang_shader_delete(sh);
  return r;
}

/* compile() as the child of kcompile.h runs it. */
static int compile_fn(void *ud, const char *src, size_t len, void **bin, size_t *binlen,
                      char *log, size_t loglen) {
  uint32_t *w = NULL;
  size_t n = 0;
  (void)ud;
  if (strlen(src) != len) {
    dspk__format(log, loglen, "glsl: the source holds a NUL byte");
    return DSPK_ECOMPILE;
  }
  int r = compile(src, &w, &n, log, loglen);
  if (r == 0) {
    *bin = w;
    *binlen = n * 4;
  }
  return r;
}

int dspk__vk_compile_main(void) {
  if (!glslang_initialize_process())
    return 2;
  /* A trivial shader sets up glslang's built-in tables for GLSL 450
   * compute before the client's source arrives (kcompile.h, spare). */
  return dspk__kcompile_serve(compile_fn, NULL,
                              "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n");
}

/* A client's source: in the child of kcompile.h when the daemon gave an
 * executable for it, under its limits. */
static int compile_client(struct dspk__dev *d, const char *src, const struct dspk__opctx *client,
                          uint32_t **spv, size_t *nwords, char *log, size_t loglen) {
  void *bin = NULL;
  size_t len = 0;
  if (!d->env.compile_exe)
    return compile(src, spv, nwords, log, loglen);
  /* Refused here already, so that no child starts for it. */
  if (dspk__src_check(src, strlen(src), DSPK__SRC_GLSL, "kernel.comp", log, loglen))
    return DSPK_ECOMPILE;
  int r = dspk__kcompile_run(&d->kspare, d->env.compile_exe, "glsl", src, strlen(src),
                             client->cancel, &bin, &len, log, loglen);
  if (r)
    return r;
  if (len % 4 || len < 20) {
    free(bin);
    dspk__format(log, loglen, "glsl: the compiler gave no SPIR-V");
    return DSPK_ECOMPILE;
  }
  *spv = bin;
  *nwords = len / 4;
  return 0;
}

/* Drops the cached module of src (see dspk__vk_glsl_to_spirv) that a get
 * served but that cannot be used (why: one phrase for the daemon's log), so
 * that it is compiled again and never served again. */
static void glsl_drop(struct dspk__dev *d, const char *name, const char *src,
                      const struct dspk__opctx *client, const char *why) {
  struct dspk__kernel_key k;
  char owner[24];
  if (!d->env.cache)
    return;
  if (client)
    snprintf(owner, sizeof owner, "uid %u", (unsigned)client->owner);
  key_of(d, name, client ? owner : NULL, src, &k);
  (void)dspk__cache_kernel_drop(d->env.cache, &k, why);
}

/* dspk__vk_glsl_to_spirv, where lookup 0 skips the cache's get (the entry
 * it served was dropped), and *cached (may be NULL) says whether the module
 * came from the cache.  A client's module from the cache is not counted in
 * kernel_cache_hits here: the caller counts it once the validator has taken
 * it (dspk__vk_kernel), and drops it otherwise. */
static int glsl_to_spirv(struct dspk__dev *d, const char *name, const char *src,
                         const struct dspk__opctx *client, int lookup, int *cached,
                         uint32_t **spv, size_t *nwords, char *log, size_t loglen,
                         char cache_id[DSPK__HASH_HEX]) {
  struct dspk__kernel_key k;
  char owner[24];
  if (client)
    snprintf(owner, sizeof owner, "uid %u", (unsigned)client->owner);
  key_of(d, name, client ? owner : NULL, src, &k);
  if (cache_id)
    cache_id[0] = '\0';
  if (cached)
    *cached = 0;
  if (d->env.cache && lookup) {
    void *bin;
    size_t len;
    if (dspk__cache_kernel_get(d->env.cache, &k, &bin, &len) == 0) {
      /* What glslang gave: whole words, a header, the magic. */
      if (len % 4 == 0 && len >= 20 && ((const uint32_t *)bin)[0] == 0x07230203) {
        if (!client)
          d->kernel_cache_hits++;
        if (cached)
          *cached = 1;
        *spv = bin;
        *nwords = len / 4;
        if (cache_id)
          dspk__cache_kernel_id(&k, cache_id);
        return 0;
      }
      free(bin);
      (void)dspk__cache_kernel_drop(d->env.cache, &k, "not a SPIR-V module (no whole words, "
                                                      "or no header with the magic 0x07230203)");
    }
  }
  int r = client ? compile_client(d, src, client, spv, nwords, log, loglen)
                 : compile(src, spv, nwords, log, loglen);
  if (r)
    return r;
  d->kernels_compiled++;
  /* A client's module is stored once it has become a pipeline
   * (dspk__vk_glsl_store): one the checks or the driver refuse would fill
   * the cache with entries that never run.  Only an entry the file has: its
   * uses count there. */
  if (!client && d->env.cache &&
      dspk__cache_kernel_put(d->env.cache, &k, *spv, *nwords * 4) == 0 && cache_id)
    dspk__cache_kernel_id(&k, cache_id);
  return 0;
}

int dspk__vk_glsl_to_spirv(struct dspk__dev *d, const char *name, const char *src,
                           const struct dspk__opctx *client, uint32_t **spv, size_t *nwords,
                           char *log, size_t loglen, char cache_id[DSPK__HASH_HEX]) {
  int cached = 0;
  int r = glsl_to_spirv(d, name, src, client, 1, &cached, spv, nwords, log, loglen, cache_id);
  if (r == 0 && cached && client)
    d->kernel_cache_hits++;
  return r;
}

/* Stores a client's module compiled from src (see above), now that its
 * pipeline is made; cache_id as dspk__vk_glsl_to_spirv's. */
static void glsl_store(struct dspk__dev *d, const char *name, const char *src,
                       const struct dspk__opctx *client, const uint32_t *spv, size_t nwords,
                       char cache_id[DSPK__HASH_HEX]) {
  struct dspk__kernel_key k;
  char owner[24];
  if (!d->env.cache || !client)
    return;
  snprintf(owner, sizeof owner, "uid %u", (unsigned)client->owner);
  key_of(d, name, owner, src, &k);
  if (dspk__cache_kernel_put(d->env.cache, &k, spv, nwords * 4) == 0)
    dspk__cache_kernel_id(&k, cache_id);
}

void dspk__vk_ap(struct dspk__vk_sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = b->over ? 0 : vsnprintf(b->p + b->at, b->len - b->at, fmt, ap);
  va_end(ap);
  if (w < 0 || (size_t)w >= b->len - b->at)
    b->over = 1;
  else
    b->at += (size_t)w;
}

/* ---- the pipeline cache ---------------------------------------------------- */

int dspk__vk_pcache_init(struct dspk__dev *d) {
  char uuid[2 * VK_UUID_SIZE + 1];
  for (int i = 0; i < (int)VK_UUID_SIZE; i++)
    snprintf(uuid + 2 * i, 3, "%02x", d->props.pipelineCacheUUID[i]);
  snprintf(d->pcache_name, sizeof d->pcache_name, "vk-pipeline-cache/%s/%u/%04x:%04x",
           uuid, d->props.driverVersion, d->props.vendorID, d->props.deviceID);
  void *data = NULL;
  size_t len = 0;
  if (d->env.cache && dspk__cache_blob_get(d->env.cache, d->pcache_name, &data, &len) != 0) {
    data = NULL;
    len = 0;
  }
  VkPipelineCacheCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                  .initialDataSize = len,
                                  .pInitialData = data};
  VkResult vr = VK(CreatePipelineCache)(d->dev, &ci, NULL, &d->pcache);
  if (vr != VK_SUCCESS && data) {
    /* Data the driver rejects: start empty, and drop it (stored by this
     * driver for this device, as the name says: it was damaged). */
    (void)dspk__cache_blob_drop(d->env.cache, d->pcache_name,
                                "the driver refused it as pipeline-cache data");
    ci.initialDataSize = 0;
    ci.pInitialData = NULL;
    vr = VK(CreatePipelineCache)(d->dev, &ci, NULL, &d->pcache);
    len = 0;
  }
  free(data);
  if (vr != VK_SUCCESS) {
    d->pcache = VK_NULL_HANDLE;
    return dspk__vk_err(vr);
  }
  d->pcache_loaded = len;
  return 0;
}

void dspk__vk_pcache_fini(struct dspk__dev *d) {
  if (!d->pcache)
    return;
  size_t len = 0;
  if (d->env.cache && d->nkernels_made_since_open &&
      VK(GetPipelineCacheData)(d->dev, d->pcache, &len, NULL) == VK_SUCCESS && len) {
    void *buf = malloc(len);
    if (buf && VK(GetPipelineCacheData)(d->dev, d->pcache, &len, buf) == VK_SUCCESS)
      dspk__cache_blob_put(d->env.cache, d->pcache_name, buf, len);
    free(buf);
  }
  VK(DestroyPipelineCache)(d->dev, d->pcache, NULL);
  d->pcache = VK_NULL_HANDLE;
}

/* ---- kernels --------------------------------------------------------------- */

static void kernel_destroy(struct dspk__dev *d, struct dspk__vk_kernel *k) {
  if (k->pipe)
    VK(DestroyPipeline)(d->dev, k->pipe, NULL);
  if (k->layout)
    VK(DestroyPipelineLayout)(d->dev, k->layout, NULL);
  if (k->dsl)
    VK(DestroyDescriptorSetLayout)(d->dev, k->dsl, NULL);
  if (k->mod)
    VK(DestroyShaderModule)(d->dev, k->mod, NULL);
  memset(k, 0, sizeof *k);
}

void dspk__vk_kernels_fini(struct dspk__dev *d) {
  for (int i = 0; i < d->nkernels; i++)
    kernel_destroy(d, &d->kernels[i]);
  free(d->kernels);
  d->kernels = NULL;
  d->nkernels = 0;
}

/* raw: a client's kernel, whose storage-buffer accesses are bounded where
 * the device can (vk.h, robust_raw). */
static int make_pipeline(struct dspk__dev *d, const uint32_t *spv, size_t nbytes,
                         const char *entry, int nbind, uint32_t pcsize, int raw,
                         struct dspk__vk_kernel *k, struct dspk__opctx *ctx) {
  VkResult vr;
  VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                 .codeSize = nbytes,
                                 .pCode = spv};
  if ((vr = VK(CreateShaderModule)(d->dev, &mi, NULL, &k->mod)) != VK_SUCCESS) {
    k->mod = VK_NULL_HANDLE;
    return dspk__vk_fail(ctx, dspk__vk_err(vr) == DSPK_ENOMEM ? DSPK_ENOMEM : DSPK_ECOMPILE,
                         "vulkan: vkCreateShaderModule failed (VkResult %d)", (int)vr);
  }
  VkDescriptorSetLayoutBinding b[DSPK__VK_MAX_BIND];
  for (int i = 0; i < nbind; i++)
    b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i,
                                          .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                          .descriptorCount = 1,
                                          .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
  VkDescriptorSetLayoutCreateInfo li = {
      .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
      .flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
      .bindingCount = (uint32_t)nbind,
      .pBindings = b};
  if ((vr = VK(CreateDescriptorSetLayout)(d->dev, &li, NULL, &k->dsl)) != VK_SUCCESS) {
    k->dsl = VK_NULL_HANDLE;
    return dspk__vk_err(vr);
  }
  VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
                            .offset = 0,
                            .size = (pcsize + 3) & ~3u};
  VkPipelineLayoutCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                   .setLayoutCount = 1,
                                   .pSetLayouts = &k->dsl,
                                   .pushConstantRangeCount = pcsize ? 1 : 0,
                                   .pPushConstantRanges = &pr};
  if ((vr = VK(CreatePipelineLayout)(d->dev, &pi, NULL, &k->layout)) != VK_SUCCESS) {
    k->layout = VK_NULL_HANDLE;
    return dspk__vk_err(vr);
  }
  VkPipelineRobustnessCreateInfoEXT rob = {
      .sType = VK_STRUCTURE_TYPE_PIPELINE_ROBUSTNESS_CREATE_INFO_EXT,
      .storageBuffers = VK_PIPELINE_ROBUSTNESS_BUFFER_BEHAVIOR_ROBUST_BUFFER_ACCESS_2_EXT,
      .uniformBuffers = VK_PIPELINE_ROBUSTNESS_BUFFER_BEHAVIOR_ROBUST_BUFFER_ACCESS_2_EXT,
      .vertexInputs = VK_PIPELINE_ROBUSTNESS_BUFFER_BEHAVIOR_DEVICE_DEFAULT_EXT,
      .images = VK_PIPELINE_ROBUSTNESS_IMAGE_BEHAVIOR_DEVICE_DEFAULT_EXT};
  VkComputePipelineCreateInfo ci = {
      .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
      .pNext = raw && d->robust_raw == 1 ? &rob : NULL,
      .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                .module = k->mod,
                .pName = entry},
      .layout = k->layout};
  if ((vr = VK(CreateComputePipelines)(d->dev, d->pcache, 1, &ci, NULL, &k->pipe)) !=
      VK_SUCCESS) {
    char echo[DSPK__ECHO_CAP(64)]; /* entry: a client's string (options.entry) */
    k->pipe = VK_NULL_HANDLE;
    return dspk__vk_fail(ctx, vr == VK_ERROR_OUT_OF_HOST_MEMORY ||
                                      vr == VK_ERROR_OUT_OF_DEVICE_MEMORY
                                  ? DSPK_ENOMEM
                                  : DSPK_ECOMPILE,
                         "vulkan: vkCreateComputePipelines failed (VkResult %d): check "
                         "the entry point \"%s\", bindings and push constants",
                         (int)vr, dspk__utf8_echo(echo, sizeof echo, entry, strlen(entry), 64));
  }
  d->nkernels_made_since_open++;
  if (d->pcache_loaded) /* the stored pipeline cache is read for this creation */
    dspk__cache_blob_used(d->env.cache, d->pcache_name);
  k->nbind = nbind;
  k->pcsize = pcsize;
  return 0;
}

/* ---- a client's pipeline tried first in a child (software devices) -------- */

/* On a software device (lavapipe) a pipeline's shader is compiled by LLVM
 * on the CPU (at its first dispatch), and a tiny module can make that take
 * minutes and GiBs
 * (a dynamically indexed local array of a few thousand floats, which the
 * zero-initialisation of vk_spvzero.c makes a large constant store): on the
 * device's runner thread that holds every user's work there, and a fault of
 * the driver would end the daemon.  So the final module (validated,
 * zero-initialised, marked) is first made into a pipeline by a child,
 * `EXE --kernel-compile vkpipe:INDEX:UUID`, which opens the same device
 * with this backend's own code (the same features, robustness and
 * extensions) under the limits of backends/common/kcompile.h: past its time
 * or memory the task is DSPK_ELIMIT, a crash of the driver there is
 * DSPK_ECOMPILE, and only a module the child made a pipeline of is made in
 * the daemon (where Mesa's shader cache, when on, usually serves what the
 * child compiled).  The child's input: nbind, pcsize and the entry's
 * length (3 native u32), the entry padded to 4 bytes, the module. */

static struct dspk__dev *g_trial_dev; /* the child's device */

static int bind_kernel(struct dspk__dev *d, struct dspk__vk_kernel *k,
                       const struct dspk__vk_bind *b, int nb, const void *pc, uint32_t pcsize,
                       VkCommandBuffer *cbp);

/* lavapipe compiles a pipeline's shader with LLVM when it is first
 * dispatched, not when it is made: the trial dispatches it over no work
 * groups (no invocation runs: the client's code never runs here), every
 * binding a 4-byte range of one block. */
static int trial_dispatch(struct dspk__dev *d, struct dspk__vk_kernel *k) {
  struct dspk__vk_bind b[DSPK__VK_MAX_BIND];
  struct dspk__mem *m = NULL;
  VkCommandBuffer cb;
  uint8_t pc[DSPK__VK_PC_MAX] = {0};
  int r = dspk__vk_alloc(d, 64, &m);
  if (r)
    return r;
  for (int i = 0; i < k->nbind; i++)
    b[i] = (struct dspk__vk_bind){.buf = m->buf, .off = m->off, .range = 4};
  r = bind_kernel(d, k, b, k->nbind, pc, k->pcsize, &cb);
  if (!r) {
    VK(CmdDispatch)(cb, 0, 0, 0);
    if (!(r = dspk__vk_submit(d)))
      r = dspk__vk_wait_value(d, d->submitted);
  }
  dspk__vk_free(d, m);
  return r;
}

static int trial_fn(void *ud, const char *in, size_t len, void **bin, size_t *binlen,
                    char *log, size_t loglen) {
  uint32_t h[3];
  struct dspk__vk_kernel k = {0};
  char entry[256];
  (void)ud;
  if (len < sizeof h)
    return DSPK_EINVAL;
  memcpy(h, in, sizeof h);
  size_t at = sizeof h + ((h[2] + 3) & ~(size_t)3);
  if (h[2] >= sizeof entry || at > len || (len - at) % 4 || h[0] > DSPK__VK_MAX_BIND ||
      h[1] > DSPK__VK_PC_MAX)
    return DSPK_EINVAL;
  memcpy(entry, in + sizeof h, h[2]);
  entry[h[2]] = 0;
  struct dspk__opctx ctx = {.errmsg = log, .errmsg_len = loglen};
  /* A test build's stand-in for a driver that faults on a module. */
  if (DSPK_TEST_HOOK("DSPK_VK_TRIAL_FAULT"))
    raise(SIGSEGV);
  /* in is malloc'd (kcompile.c): its words are aligned. */
  int r = make_pipeline(g_trial_dev, (const uint32_t *)(const void *)(in + at), len - at,
                        entry, (int)h[0], h[1], 1, &k, &ctx);
  if (!r)
    r = trial_dispatch(g_trial_dev, &k);
  kernel_destroy(g_trial_dev, &k);
  if (r)
    return r;
  *bin = NULL;
  *binlen = 0;
  return 0;
}

int dspk__vk_trial_main(const char *spec) {
  struct dspk__devinfo info[16];
  char why[256], *end;
  uint32_t *spv = NULL;
  size_t nw = 0;
  /* Ends with the daemon's thread that asked, even while the device opens. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  long index = strtol(spec, &end, 10);
  if (end == spec || *end != ':' || index < 0)
    return 2;
  int n = dspk__backend_vulkan.probe(info, 16, why, sizeof why);
  /* The daemon's device, the same in this process's list. */
  if (index >= n || strcmp(info[index].uuid, end + 1) != 0)
    return 2;
  if (dspk__backend_vulkan.open((int)index, NULL, &g_trial_dev) != 0)
    return 2;
  /* A first pipeline sets up the driver's compiler before the client's
   * module arrives (kcompile.h, spare). */
  static const char warm[] =
      "#version 450\nlayout(local_size_x = 64) in;\n"
      "layout(std430, binding = 0) buffer A { float a[]; };\n"
      "layout(std430, binding = 1) buffer B { float b[]; };\n"
      "layout(push_constant) uniform P { uint n; float s; };\n"
      "void main() { float t[4]; uint i = gl_GlobalInvocationID.x; t[i & 3u] = a[i];\n"
      "  if (i < n) b[i] = t[n & 3u] * s + sqrt(a[i]); }\n";
  if (compile(warm, &spv, &nw, why, sizeof why) == 0) {
    struct dspk__vk_kernel k = {0};
    if (make_pipeline(g_trial_dev, spv, nw * 4, "main", 2, 8, 1, &k, NULL) == 0)
      trial_dispatch(g_trial_dev, &k);
    kernel_destroy(g_trial_dev, &k);
    free(spv);
  }
  /* The process ends once it answered, without closing the device (the
   * daemon waits for its end). */
  _exit(dspk__kcompile_serve(trial_fn, NULL, NULL));
}

/* Whether d tries clients' pipelines first (a software device of a
 * daemon), and then the child's LANG. */
static int trial_lang(struct dspk__dev *d, char lang[64]) {
  if (!d->env.compile_exe || d->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU)
    return 0;
  snprintf(lang, 64, "vkpipe:%d:%s", d->index, d->uuid);
  return 1;
}

/* A raw kernel is coming: its trial's child starts now, and sets up its
 * device while the source compiles and the module is checked. */
static void trial_ahead(struct dspk__dev *d) {
  char lang[64];
  if (d->pspare.pid <= 0 && trial_lang(d, lang))
    dspk__kcompile_spare_start(&d->pspare, d->env.compile_exe, lang);
}

/* The trial of the pipeline of module spv (nbytes) in a child where d
 * tries them (see above); 0 elsewhere. */
static int trial_pipeline(struct dspk__dev *d, const uint32_t *spv, size_t nbytes,
                          const char *entry, int nbind, uint32_t pcsize,
                          struct dspk__opctx *ctx) {
  char lang[64], log[1024] = "";
  if (!trial_lang(d, lang))
    return 0;
  size_t elen = strlen(entry), at = 12 + ((elen + 3) & ~(size_t)3);
  uint32_t h[3] = {(uint32_t)nbind, pcsize, (uint32_t)elen};
  void *bin = NULL;
  size_t binlen = 0;
  char *in = calloc(1, at + nbytes);
  if (!in)
    return DSPK_ENOMEM;
  memcpy(in, h, sizeof h);
  memcpy(in + sizeof h, entry, elen);
  memcpy(in + at, spv, nbytes);
  int r = dspk__kcompile_run(&d->pspare, d->env.compile_exe, lang, in, at + nbytes,
                             ctx ? ctx->cancel : NULL, &bin, &binlen, log, sizeof log);
  free(in);
  free(bin);
  if (r && r != DSPK_ENOMEM)
    dspk__vk_fail(ctx, r, "%s", log[0] ? log : "kernel: the pipeline could not be made");
  return r;
}

/* A use of k served from memory: recent in the table, and in the
 * persistent cache (batched there, no write per use). */
static void kernel_used(struct dspk__dev *d, struct dspk__vk_kernel *k) {
  k->last_use = ++d->kclock;
  dspk__cache_kernel_used(d->env.cache, k->cache_id);
}

struct dspk__vk_kernel *dspk__vk_kmemo_get(struct dspk__dev *d, struct dspk__vk_kmemo *m) {
  struct dspk__vk_kernel *k = m->k;
  if (!k || !k->pipe || k->key[0] != m->key[0] || k->key[1] != m->key[1])
    return NULL;
  kernel_used(d, k);
  return k;
}

void dspk__vk_kmemo_set(struct dspk__vk_kmemo *m, struct dspk__vk_kernel *k) {
  m->k = k;
  m->key[0] = k->key[0];
  m->key[1] = k->key[1];
}

int dspk__vk_kernel(struct dspk__dev *d, const char *name, const char *src,
                    const void *spirv, size_t nbytes, const char *entry, int nbind,
                    uint32_t pcsize, struct dspk__vk_kernel **out,
                    struct dspk__opctx *ctx) {
  if (nbind < 0 || nbind > DSPK__VK_MAX_BIND || pcsize > DSPK__VK_PC_MAX)
    return dspk__vk_fail(ctx, DSPK_ELIMIT,
                         "vulkan: %d bindings, %u push-constant bytes (at most %d, %d)",
                         nbind, pcsize, DSPK__VK_MAX_BIND, DSPK__VK_PC_MAX);
  struct dspk__hash h;
  dspk__hash_init(&h);
  /* The language first: GLSL text given as "spirv" is refused (below),
   * never the pipeline compiled from the same bytes given as GLSL. */
  dspk__hash_str(&h, spirv ? "spirv" : "glsl");
  if (spirv)
    dspk__hash_field(&h, spirv, nbytes);
  else
    dspk__hash_str(&h, src);
  dspk__hash_str(&h, entry);
  dspk__hash_u64(&h, (uint64_t)nbind);
  dspk__hash_u64(&h, pcsize);
  /* A client's kernel is made zero-initialised (below), and is its owner's
   * alone (op.h, owner): never the same pipeline as one of ours of the same
   * source, and the table keeps one pipeline per owner, so a table hit
   * tells nobody about another. */
  int raw = strcmp(name, "raw") == 0;
  dspk__hash_u64(&h, (uint64_t)raw);
  if (raw) {
    dspk__hash_str(&h, "owner");
    dspk__hash_u64(&h, ctx ? ctx->owner : 0);
  }
  for (int i = 0; i < d->nkernels; i++) {
    struct dspk__vk_kernel *k = &d->kernels[i];
    if (k->key[0] == h.hi && k->key[1] == h.lo) {
      kernel_used(d, k);
      *out = k;
      return 0;
    }
  }
  if (!d->kernels) {
    d->kernels = calloc(DSPK__VK_KERNELS, sizeof *d->kernels);
    if (!d->kernels)
      return DSPK_ENOMEM;
  }
  struct dspk__vk_kernel *k;
  if (d->nkernels < DSPK__VK_KERNELS) {
    k = &d->kernels[d->nkernels++];
  } else {
    /* Evict the least recently used: pending work may still use it, so
     * wait for the queue first (rare: the table is large). */
    k = &d->kernels[0];
    for (int i = 1; i < d->nkernels; i++)
      if (d->kernels[i].last_use < k->last_use)
        k = &d->kernels[i];
    dspk__vk_submit(d);
    dspk__vk_wait_value(d, d->submitted);
    kernel_destroy(d, k);
  }
  uint32_t *spv = NULL, *compiled = NULL;
  size_t nwords = 0, compiled_words = 0;
  char cache_id[DSPK__HASH_HEX] = "";
  int r, cached = 0, lookup = 1;
  const void *given = spirv;
  if (raw)
    trial_ahead(d);
again:
  if (!spirv) {
    char log[2048] = "";
    r = glsl_to_spirv(d, name, src, raw ? ctx : NULL, lookup, &cached, &spv, &nwords, log,
                      sizeof log, cache_id);
    if (r) {
      /* The generated kernels always compile: a log here is a client's
       * (glslang's, "glsl: ..."; a refused #include as docs/protocol.md
       * spells it, "kernel.comp:LINE: ..."). */
      dspk__vk_fail(ctx, r, "%s", log[0] ? log : "glsl: compilation failed");
      goto fail;
    }
    spirv = spv;
    nbytes = nwords * 4;
    compiled_words = nwords;
  } else if (nbytes >= 20 && nbytes % 4 == 0 &&
             !memcmp(spirv, &(const uint32_t){0x03022307}, 4)) {
    /* SPIR-V allows either byte order; Vulkan takes the host's alone. */
    r = dspk__vk_fail(ctx, DSPK_EINVAL,
                      "spirv: the module's words are byte-swapped (its magic reads 0x03022307: "
                      "SPIR-V of the other byte order); Vulkan takes SPIR-V in the host's "
                      "byte order: swap each 4-byte word");
    goto fail;
  } else if (nbytes < 20 || nbytes % 4 || memcmp(spirv, &(const uint32_t){0x07230203}, 4)) {
    r = dspk__vk_fail(ctx, DSPK_EINVAL,
                      "spirv: not a SPIR-V binary (%zu byte%s, needs a multiple of 4 "
                      "starting with the magic 0x07230203)",
                      nbytes, nbytes == 1 ? "" : "s");
    goto fail;
  }
  /* A client's kernel: its SPIR-V must be valid (vk_spvval.c; Vulkan
   * leaves an invalid module undefined, and lavapipe faults on some), the
   * resources it uses must be those the layout has, and its work-group size
   * and shared memory within the device's limits (vk_spvcheck.c), and what
   * it reads before writing is zero, never bytes an earlier task left in
   * workgroup memory or registers (vk_spvzero.c, on the validated module);
   * the generated kernels are ours. */
  uint32_t *marked = NULL;
  if (raw) {
    char msg[1024] = "", mark[48];
    const uint32_t *w = spirv;
    uint32_t *copy = NULL, *z = NULL, *clamped = NULL;
    size_t nz = 0, nw = 0, ncl = 0;
    if ((uintptr_t)spirv % sizeof(uint32_t)) {
      if (!(copy = malloc(nbytes))) {
        r = DSPK_ENOMEM;
        goto fail;
      }
      memcpy(copy, spirv, nbytes);
      w = copy;
    }
    r = dspk__vk_spv_validate_client(d, w, nbytes / 4, ctx ? ctx->cancel : NULL, &clamped,
                                     &ncl, msg, sizeof msg);
    if (cached && r && r != DSPK_ENOMEM && r != DSPK_ECANCELED) {
      /* The module the cache served was stored once the validator and
       * the driver had taken it (glsl_store): refused now, it was damaged
       * in the file.  Dropped, and compiled from the client's source as on
       * a miss; never the client's error. */
      glsl_drop(d, name, src, ctx, msg[0] ? msg : "the SPIR-V validator refused it");
      free(copy);
      free(spv);
      spv = NULL;
      spirv = given;
      lookup = 0;
      cached = 0;
      goto again;
    }
    if (r == DSPK_EINVAL && !cached) {
      /* The clamping refused the validated module (vk_spvrobust.c): where
       * a documented check refuses it too, that check's error says what
       * to change, as on a module the pass takes (the same checks in the
       * same order, on the module before the clamping, which has the same
       * resources and capabilities): an array of storage buffers, which
       * the pass cannot match to the module (its binding named), a
       * capability no kernel may declare (a PhysicalStorageBuffer64
       * addressing model, variable pointers). */
      char why[1024] = "";
      int c = dspk__vk_spv_check(w, nbytes / 4, entry, nbind, pcsize, &d->props.limits, why,
                                 sizeof why);
      if (!c)
        c = dspk__vk_spv_caps(w, nbytes / 4, d->kcaps, d->nkcaps, why, sizeof why);
      if (c == DSPK_ENOMEM || (c && why[0])) {
        r = c;
        snprintf(msg, sizeof msg, "%s", why);
      }
    }
    if (!r && cached)
      d->kernel_cache_hits++;
    /* From here on the module is the clamped one (vk_spvrobust.c): every
     * index into memory other than a buffer is within its array, whether
     * the module was the client's, compiled now or served by the cache,
     * which holds glslang's output and never a clamped module. */
    if (!r) {
      free(copy);
      copy = clamped;
      w = clamped;
      nbytes = ncl * 4;
    }
    if (!r)
      r = dspk__vk_spv_check(w, nbytes / 4, entry, nbind, pcsize, &d->props.limits, msg,
                             sizeof msg);
    if (!r)
      r = dspk__vk_spv_caps(w, nbytes / 4, d->kcaps, d->nkcaps, msg, sizeof msg);
    if (!r)
      r = dspk__vk_spv_zero_init(w, nbytes / 4, d->zero_wg, &z, &nz, msg, sizeof msg);
    /* The driver's own caches (the VkPipelineCache, Mesa's and NVIDIA's
     * in-memory and disk caches) key a pipeline by its module's bytes: a
     * mark naming the owner makes those of two users differ, so neither
     * can time a hit on the other's pipeline. */
    snprintf(mark, sizeof mark, "dspk-owner-uid-%u", (unsigned)(ctx ? ctx->owner : 0));
    if (!r)
      r = dspk__vk_spv_mark(z, nz, mark, &marked, &nw);
    free(copy);
    if (r) {
      free(z);
      if (msg[0] && r != DSPK_ENOMEM)
        dspk__vk_fail(ctx, r, "%s", msg);
      goto fail;
    }
    compiled = spv; /* a client's GLSL module: stored once its pipeline is made */
    spv = z;
    spirv = marked;
    nbytes = nw * 4;
  }
  r = raw ? trial_pipeline(d, spirv, nbytes, entry, nbind, pcsize, ctx) : 0;
  if (!r)
    r = make_pipeline(d, spirv, nbytes, entry, nbind, pcsize, raw, k, ctx);
  if (!r && compiled && !cache_id[0])
    glsl_store(d, name, src, ctx, compiled, compiled_words, cache_id);
  free(compiled);
  free(marked);
  free(spv);
  if (r) {
    kernel_destroy(d, k);
    goto fail_slot;
  }
  k->key[0] = h.hi;
  k->key[1] = h.lo;
  memcpy(k->cache_id, cache_id, sizeof cache_id);
  k->last_use = ++d->kclock;
  *out = k;
  return 0;
fail:
  free(spv);
fail_slot:
  /* Give the slot back (it is the last one unless we evicted). */
  if (k == &d->kernels[d->nkernels - 1])
    d->nkernels--;
  return r;
}

/* ---- binding and dispatch --------------------------------------------------- */

uint64_t dspk__vk_max_tensor_bytes(const VkPhysicalDeviceLimits *l) {
  uint64_t align = l->minStorageBufferOffsetAlignment < 4 ? 4 : l->minStorageBufferOffsetAlignment;
  uint64_t range = l->maxStorageBufferRange & ~(uint64_t)3;
  return range > align - 1 ? range - (align - 1) : 0;
}

int dspk__vk_bind_tensor(struct dspk__dev *d, const struct dspk__tensor *t,
                         struct dspk__vk_bind *b, uint32_t *elem) {
  struct dspk__mem *m = t->mem;
  VkDeviceSize es = dspk__dtype_size(t->dtype);
  if (es == 0 || t->offset % es != 0)
    return DSPK_ENOTSUP;
  /* The limit the devices answer gives, whatever the offset: within it the
   * range below (the alignment's padding, less than d->align before the
   * tensor, whose place is a multiple of its element size; then up to a
   * multiple of 4) is within maxStorageBufferRange. */
  if (dspk__tensor_nbytes(t) > dspk__vk_max_tensor_bytes(&d->props.limits))
    return DSPK_ENOTSUP;
  /* Both are powers of two: the larger is a multiple of the smaller. */
  VkDeviceSize a = d->align > es ? d->align : es;
  VkDeviceSize byte = m->off + t->offset;
  VkDeviceSize base = byte / a * a;
  VkDeviceSize need = (byte - base) + dspk__tensor_nbytes(t);
  /* Shaders read 16-bit data as 32-bit words, and robust buffer access
   * drops a word the range covers only in part (lavapipe returns 0 for it):
   * the range ends at a multiple of 4.  The pool's blocks are multiples of 4
   * bytes; an import of a client's pages has exactly the bytes the client
   * named (an odd number of f16 elements ends at 2 mod 4), but its VkBuffer
   * covers whole units of the import alignment, within the mapping's last
   * page (vk_mem.c import_ptr): the range may end there. */
  VkDeviceSize end = m->imported ? m->bufsize : m->off + m->size;
  VkDeviceSize avail = end - base;
  need = (need + 3) & ~(VkDeviceSize)3;
  if (need < 4)
    need = 4;
  if (need > avail)
    need = avail;
  if (need > d->props.limits.maxStorageBufferRange)
    return DSPK_ENOTSUP;
  b->buf = m->buf;
  b->off = base;
  b->range = need;
  if (elem)
    *elem = (uint32_t)((byte - base) / es);
  return 0;
}

int dspk__vk_bind_named(struct dspk__dev *d, const struct dspk__tensor *t,
                        struct dspk__vk_bind *b, uint32_t *elem, struct dspk__opctx *ctx,
                        const char *what) {
  int r = dspk__vk_bind_tensor(d, t, b, elem);
  size_t es = dspk__dtype_size(t->dtype);
  if (r == 0)
    return 0;
  if (r != DSPK_ENOTSUP)
    return dspk__vk_fail(ctx, r, "vulkan: %s cannot be bound", what);
  if (es == 0 || t->offset % es != 0)
    return dspk__vk_fail(ctx, r, "vulkan: %s starts at byte offset %zu, not a multiple of "
                                 "its element size (%zu bytes)",
                         what, t->offset, es);
  /* The arithmetic of dspk__vk_max_tensor_bytes, in words that add up:
   * the range (down to a multiple of 4) less the alignment less one. */
  unsigned long long range = d->props.limits.maxStorageBufferRange;
  unsigned long long range4 = range & ~3ull;
  char down[64] = "";
  if (range4 != range)
    snprintf(down, sizeof down, " down to a multiple of 4, %llu,", range4);
  return dspk__vk_fail(ctx, r, "vulkan: %s (%zu bytes) is larger than one binding of this "
                               "device can be at any offset: %llu bytes (max_tensor_bytes "
                               "in devices: maxStorageBufferRange %llu%s less %llu, one less "
                               "than the storage buffers' offset alignment %llu)",
                       what, dspk__tensor_nbytes(t),
                       (unsigned long long)dspk__vk_max_tensor_bytes(&d->props.limits), range,
                       down, (unsigned long long)d->align - 1, (unsigned long long)d->align);
}

/* Binds k, its bindings and push constants in the open command buffer
 * (opening one). */
static int bind_kernel(struct dspk__dev *d, struct dspk__vk_kernel *k,
                       const struct dspk__vk_bind *b, int nb, const void *pc, uint32_t pcsize,
                       VkCommandBuffer *cbp) {
  VkCommandBuffer cb;
  int r = dspk__vk_cmd(d, &cb);
  if (r)
    return r;
  VkDescriptorBufferInfo bi[DSPK__VK_MAX_BIND];
  VkWriteDescriptorSet w[DSPK__VK_MAX_BIND];
  for (int i = 0; i < nb; i++) {
    bi[i] = (VkDescriptorBufferInfo){.buffer = b[i].buf, .offset = b[i].off,
                                     .range = b[i].range};
    w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                  .dstBinding = (uint32_t)i,
                                  .descriptorCount = 1,
                                  .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                  .pBufferInfo = &bi[i]};
  }
  VK(CmdBindPipeline)(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipe);
  if (nb)
    d->CmdPushDescriptorSetKHR(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k->layout, 0,
                               (uint32_t)nb, w);
  if (pcsize && k->pcsize) {
    uint8_t buf[DSPK__VK_PC_MAX] = {0};
    memcpy(buf, pc, pcsize < k->pcsize ? pcsize : k->pcsize);
    VK(CmdPushConstants)(cb, k->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                         (k->pcsize + 3) & ~3u, buf);
  }
  *cbp = cb;
  return 0;
}

int dspk__vk_dispatch(struct dspk__dev *d, struct dspk__vk_kernel *k,
                      const struct dspk__vk_bind *b, int nb, const void *pc,
                      uint32_t pcsize, uint32_t gx, uint32_t gy, uint32_t gz) {
  VkCommandBuffer cb;
  int r = bind_kernel(d, k, b, nb, pc, pcsize, &cb);
  if (r)
    return r;
  if (gx && gy && gz)
    VK(CmdDispatch)(cb, gx, gy, gz);
  dspk__vk_barrier(d);
  return 0;
}

int dspk__vk_dispatch_indirect(struct dspk__dev *d, struct dspk__vk_kernel *k,
                               const struct dspk__vk_bind *b, int nb, const void *pc,
                               uint32_t pcsize, const struct dspk__vk_bind *args) {
  VkCommandBuffer cb;
  int r = bind_kernel(d, k, b, nb, pc, pcsize, &cb);
  if (r)
    return r;
  VK(CmdDispatchIndirect)(cb, args->buf, args->off);
  dspk__vk_barrier(d);
  return 0;
}

int dspk__vk_grid2d(struct dspk__dev *d, uint64_t ngroups, uint32_t *gx, uint32_t *gy,
                    const char *op, uint64_t count, const char *noun,
                    struct dspk__opctx *ctx) {
  uint64_t mx = dspk__vk_max_groups(d, 0);
  uint64_t x = ngroups < mx ? ngroups : mx;
  uint64_t y = x ? (ngroups + x - 1) / x : 0;
  if (y > dspk__vk_max_groups(d, 1))
    return dspk__vk_fail(ctx, DSPK_ELIMIT, "%s: %llu %s exceed the dispatch limits", op,
                         (unsigned long long)count, noun);
  *gx = (uint32_t)x;
  *gy = (uint32_t)y;
  return 0;
}

int dspk__vk_dispatch_sliced(struct dspk__dev *d, struct dspk__vk_kernel *k,
                             const struct dspk__vk_bind *b, int nb, void *pc, uint32_t pcsize,
                             uint32_t gx, uint32_t gy, uint64_t n, uint64_t slice,
                             dspk__vk_slice_fn *set) {
  uint64_t r0 = 0;
  do {
    uint64_t rn = n - r0 < slice ? n - r0 : slice;
    set(pc, r0, rn, n);
    int r = dspk__vk_dispatch(d, k, b, nb, pc, pcsize, gx, gy, 1);
    if (r)
      return r;
    r0 += rn;
  } while (r0 < n);
  return 0;
}
