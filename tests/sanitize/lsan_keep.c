/*
 * Linked into every executable of a sanitizer build (DSPK_SANITIZE=ON), never
 * into a production build.  Two things, both about reading LeakSanitizer's
 * report correctly:
 *
 * 1. dlclose() keeps the library mapped.  LeakSanitizer reports at exit,
 *    after the Vulkan loader has dlclose()d the ICDs (lavapipe among them),
 *    so a block a driver leaked shows up as "<unknown module>" and can be
 *    neither attributed nor suppressed by name.  This definition in the
 *    executable (exported with --export-dynamic-symbol) takes the place of
 *    libc's for every caller, the loader included; libraries then stay
 *    mapped until exit and every frame keeps its module name.
 *
 * 2. The leak suppressions, compiled in so every test, CLI run and daemon of
 *    the sanitizer build uses the same list whatever the environment.  Only
 *    modules of third parties are named, so a leak of our own code still
 *    fails the run (tests/sanitize checks both).
 */
#include <stddef.h>

#define DSPK_EXPORT __attribute__((visibility("default")))

DSPK_EXPORT int dlclose(void *handle);
DSPK_EXPORT const char *__lsan_default_suppressions(void);

int dlclose(void *handle) {
  (void)handle;
  return 0;
}

const char *__lsan_default_suppressions(void) {
  /* Mesa's Vulkan drivers (libvulkan_lvp.so, libvulkan_radeon.so, ...; not
   * the loader libvulkan.so.1) and the LLVM they JIT with: lavapipe
   * 22.3.6-1+deb12u2 leaks a 128-byte block at exit on a fresh machine. */
  return "leak:libvulkan_\n"
         "leak:libLLVM-\n";
}
