/*
 * SPIRV-Tools' GraphicsRobustAccessPass (spirv-opt --graphics-robust-access)
 * run on a client's module, behind one C function (vk.h,
 * dspk__vk_spv_robust_pass).  SPIRV-Tools 2023.1 (Debian 12) has no C
 * interface to its optimizer (spvOptimizerCreate came later), so this is
 * the one C++ file of the project: it holds no logic of its own, only the
 * library's documented C++ entry points (spirv-tools/optimizer.hpp), and
 * lets no exception out to C.  vk_spvrobust.c says what the pass does and
 * how dspk uses it.
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <spirv-tools/optimizer.hpp>

extern "C" {
#include "dspk/errors.h"
int dspk__vk_spv_robust_pass(int vulkan13, const uint32_t *w, size_t nw, uint32_t **out,
                             size_t *nout, char *msg, size_t msglen);
}

int dspk__vk_spv_robust_pass(int vulkan13, const uint32_t *w, size_t nw, uint32_t **out,
                             size_t *nout, char *msg, size_t msglen) {
  try {
    std::string first;
    spvtools::Optimizer opt(vulkan13 ? SPV_ENV_VULKAN_1_3 : SPV_ENV_VULKAN_1_2);
    opt.SetMessageConsumer([&first](spv_message_level_t level, const char *, const spv_position_t &,
                                    const char *m) {
      if (level <= SPV_MSG_ERROR && first.empty() && m)
        first = m;
    });
    opt.RegisterPass(spvtools::CreateGraphicsRobustAccessPass());
    spvtools::OptimizerOptions oo;
    oo.set_run_validator(false); /* the caller validated the module */
    std::vector<uint32_t> o;
    if (!opt.Run(w, nw, &o, oo)) {
      if (msglen)
        snprintf(msg, msglen, "%s", first.empty() ? "the pass failed" : first.c_str());
      return DSPK_ENOTSUP;
    }
    uint32_t *p = static_cast<uint32_t *>(malloc(o.size() * sizeof *p + 1));
    if (!p)
      return DSPK_ENOMEM;
    if (!o.empty())
      memcpy(p, o.data(), o.size() * sizeof *p);
    *out = p;
    *nout = o.size();
    return 0;
  } catch (const std::bad_alloc &) {
    return DSPK_ENOMEM;
  } catch (...) {
    if (msglen)
      snprintf(msg, msglen, "the pass failed");
    return DSPK_ENOTSUP;
  }
}
