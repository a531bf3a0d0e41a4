/*
 * Test hooks: environment variables that make a test build take a path on
 * purpose (an exit path of dspkd, a forced gemm kernel, a fake CUDA driver,
 * small caches).  They exist only when the build enables DSPK_TEST_HOOKS
 * (CMake option; on where the tests are built, off in the Debian packages:
 * packaging/build-debs.sh, and tests/install/debs.sh checks that the
 * packaged binaries hold no hook name).  Without it DSPK_TEST_HOOK(name) is
 * NULL and the name is not even compiled in, so a production binary never
 * reads them.  A build with them is not installed (cmake --install stops
 * unless DSPK_INSTALL_TEST_BUILD=1) and its dspkd warns at start for each
 * hook variable set (daemon/testhooks.c).  Every other environment variable
 * the product reads is documented (dspkd(8), ENVIRONMENT).
 */
#ifndef DSPK_PROTO_TESTHOOK_H
#define DSPK_PROTO_TESTHOOK_H

#ifdef DSPK_TEST_HOOKS
#include <stdlib.h>
/* The value of the hook's environment variable, or NULL. */
#define DSPK_TEST_HOOK(name) getenv(name)
#else
#define DSPK_TEST_HOOK(name) ((const char *)NULL)
#endif

#endif /* DSPK_PROTO_TESTHOOK_H */
