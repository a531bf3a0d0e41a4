/* A stand-in for a third-party Vulkan driver that leaks one block: built as
 * libvulkan_dspkfake.so for tests/sanitize (see leak_own.c). */
#include <stdlib.h>
#include <string.h>

__attribute__((visibility("default"))) void dspk_fake_driver_leak(void);
void *volatile dspk_fake_driver_sink;

void dspk_fake_driver_leak(void) {
  char *p = malloc(128);
  if (p)
    memset(p, 2, 128);
  dspk_fake_driver_sink = p;
  dspk_fake_driver_sink = NULL;
}
