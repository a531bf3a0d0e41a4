/*
 * Proves the sanitizer build still fails on a leak of our own code while a
 * leak inside a dlclose()d third-party driver module is suppressed.
 *   leak_own own      leaks a block from this program: LeakSanitizer must
 *                     report it and the exit status must be non-zero.
 *   leak_own driver M dlopen()s M (a stand-in named like a Mesa ICD), calls
 *                     its leaking function, dlclose()s it: must exit 0.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *volatile dspk_test_sink;

static int own_leak(void) {
  char *p = malloc(128);
  if (!p)
    return 1;
  memset(p, 1, 128);
  dspk_test_sink = p;
  dspk_test_sink = NULL; /* the only pointer is gone: a real leak */
  return 0;
}

static int driver_leak(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "leak_own: %s\n", dlerror());
    return 2;
  }
  void (*fn)(void) = (void (*)(void))dlsym(h, "dspk_fake_driver_leak");
  if (!fn) {
    fprintf(stderr, "leak_own: %s\n", dlerror());
    return 2;
  }
  fn();
  return dlclose(h) == 0 ? 0 : 2;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "own") == 0)
    return own_leak();
  if (argc == 3 && strcmp(argv[1], "driver") == 0)
    return driver_leak(argv[2]);
  fprintf(stderr, "usage: leak_own own | leak_own driver MODULE\n");
  return 2;
}
