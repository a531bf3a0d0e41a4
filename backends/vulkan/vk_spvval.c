/*
 * A client's SPIR-V validated before the driver sees it.  Vulkan requires
 * the module of vkCreateShaderModule to be valid SPIR-V for the API version
 * (VkShaderModuleCreateInfo: "pCode must point to valid SPIR-V code") and
 * leaves anything else undefined: a driver may refuse it, run it, or fault
 * (lavapipe dies in vkCreateComputePipelines on a module that decorates an
 * id nothing defines).  So every raw kernel's module (lang spirv, and the
 * SPIR-V glslang made of a client's GLSL) goes through SPIRV-Tools'
 * validator (spirv-val's library) for the Vulkan version the device was
 * created with, and one it refuses never reaches the driver.  The daemon's
 * generated kernels are ours and are not validated here.
 *
 * The validator is paid once per module: kernels are memoized per device
 * (vk_shader.c), and a module in the table is not validated again.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* libspirv.h defines a const at file scope, which in C is an external
 * definition: renamed here so that no other C file including it collides. */
#define kDefaultMaxIdBound dspk__vk_spvval_kDefaultMaxIdBound
#include <spirv-tools/libspirv.h>
#undef kDefaultMaxIdBound

#include "backends/vulkan/vk.h"
#include "dspk/errors.h"
#include "proto/utf8.h"

/* The validator's message as echoed: it may quote the module's own strings
 * (OpName, OpString, an entry point's name), which are the client's. */
#define ECHO_MAX 400

/* The validator's environment for a device of Vulkan apiVersion api, within
 * the instance's 1.3 (vk_backend.c); the backend needs 1.2. */
static spv_target_env env_of(uint32_t api, const char **name) {
  if (VK_API_VERSION_MINOR(api) >= 3 || VK_API_VERSION_MAJOR(api) > 1) {
    *name = "vulkan1.3";
    return SPV_ENV_VULKAN_1_3;
  }
  *name = "vulkan1.2";
  return SPV_ENV_VULKAN_1_2;
}

int dspk__vk_spv_validate(uint32_t api, const uint32_t *w, size_t nw, char *msg,
                          size_t msglen) {
  const char *envname;
  spv_target_env env = env_of(api, &envname);
  spv_context ctx = spvContextCreate(env);
  if (!ctx)
    return DSPK_ENOMEM;
  spv_validator_options opt = spvValidatorOptionsCreate();
  if (!opt) {
    spvContextDestroy(ctx);
    return DSPK_ENOMEM;
  }
  /* The device enables none of the block-layout features beyond the
   * version's own (vk_backend.c), so the defaults are the device's rules. */
  spv_const_binary_t bin = {.code = w, .wordCount = nw};
  spv_diagnostic diag = NULL;
  spv_result_t vr = spvValidateWithOptions(ctx, opt, &bin, &diag);
  int r = 0;
  if (vr == SPV_ERROR_OUT_OF_MEMORY) {
    r = DSPK_ENOMEM;
  } else if (vr != SPV_SUCCESS) {
    char echo[2 * ECHO_MAX + 2];
    const char *text = diag && diag->error ? diag->error : "";
    dspk__utf8_echo(echo, sizeof echo, text, strlen(text), ECHO_MAX);
    r = dspk__fail(msg, msglen, DSPK_ECOMPILE, "spirv: invalid SPIR-V module (spirv-val, %s): %s",
                   envname, echo[0] ? echo : "refused");
  }
  spvDiagnosticDestroy(diag);
  spvValidatorOptionsDestroy(opt);
  spvContextDestroy(ctx);
  return r;
}
